/*
 * batch.pml: a Promela model of the batch path of watermill-dedup
 * (dedup.Engine.DoBatch as the Lambda adapters use it; DESIGN.md "Batches"
 * and "Store operations").
 *
 * One batch of three records, two business keys, two FIFO message groups:
 *
 *   record   key   group
 *     r0      x      A
 *     r1      k      B      the first occurrence of k in batch order
 *     r2      k      A      a copy of k, in a group that runs BEFORE r1's
 *
 * An invocation claims each distinct key of its batch once, up front, with a
 * lease ending at the invocation's deadline (no heartbeat). Then the records
 * take their turn: a group's records one after the other, in order; the
 * groups one after the other (CONC 1: group A first, as r0 comes first) or
 * at once (CONC 2). A record whose claim was won runs its handler (the
 * effect: a counter per key). Its completion is sent as soon as its handler
 * returns (completions stream); the release of a failed record too. The
 * copy of k that takes its turn first runs, adopting the batch's claim; a
 * later copy is a Duplicate of it once it succeeded, fails when it failed,
 * and waits only while it is running. Records that must not start (a group
 * after a failure, less than MARGIN ticks left: StartBy) are released
 * unstarted. The invocation returns once every record has ended and every
 * completion has landed: the records that succeeded are acked, the others
 * are redelivered in a later invocation. The invocation can be killed at its
 * deadline (nothing more runs, nothing more is sent) and the process can
 * crash at any step; then nothing is acked and the whole batch comes back.
 *
 * Run it with docs/model/model_test.go (TestBatchModel), or by hand (README.md):
 *   spin -a [-DNAME ...] batch.pml && gcc -O0 -DSAFETY -o pan pan.c && ./pan -N at_most_once
 *
 * Variants (spin -DNAME):
 *   CONC=2                     groups A and B take their turns at once (default 1: one after the other)
 *   TIMELY                     the timing assumption of the liveness checks: every step of a live
 *                              invocation is urgent (time passes only while nothing but a wait can
 *                              move), except in MAXSLOW slow invocations; an SQS redelivery comes
 *                              after the visibility timeout, so after the leases of a dead
 *                              invocation have ended
 *   NO_DEADLINE                a batch without a deadline (a Go consumer's DoBatch): no StartBy, no
 *                              kill, the claims of a live batch are kept by heartbeats, waits are
 *                              unbounded
 *   MUTANT_COMPLETE_AT_END     the old design: completions are queued and sent only once the batch's
 *                              last handler has returned
 *   MUTANT_OLD_COPY_RULE       the old copy rule: a copy always waits for the lowest-index occurrence
 *                              of its key (until it ends or StartBy passes), even one that has not
 *                              started; only that occurrence may run
 *   REACH_COPY_FIRST           sanity: assert that the copy r2 never runs while r1 waits for its turn
 *   REACH_COPY_WAITS           sanity: assert that no copy ever waits for a running call
 *   REACH_TIMEOUT_AFTER_COMPLETE  sanity: assert that no invocation is killed after a completion landed
 *   REACH_TAKEOVER             sanity: assert that no claim takes over an expired lease
 *   REACH_INPROGRESS           sanity: assert that no claim answers InProgress
 *   REACH_LATE_RELEASE         sanity: assert that no claim is released unstarted because StartBy passed
 *   NOLTL                      leave out the ltl blocks (for the REACH_ runs)
 * Bounds (spin -DNAME=value): T (invocation timeout, ticks), MARGIN (StartBy is MARGIN ticks
 * before the deadline), MAXCRASH, MAXKILL (invocations killed at their deadline), MAXFAIL
 * (handler errors), MAXSLOW (TIMELY: slow invocations).
 *
 * Properties (ltl, pan -N): at_most_once (a), strictly_once (violated: the window),
 * waits_on_running (b), eventually_done and no_wasted_invocation (b, with TIMELY),
 * hang_repeats (the story of MUTANT_COMPLETE_AT_END); with NOLTL: assertions and
 * invalid end states (b).
 */

#ifndef T
#define T 3             /* invocation timeout, in clock ticks; every lease is T from the claim */
#endif
#ifndef MARGIN
#define MARGIN 1        /* StartBy: a record reached with MARGIN ticks or less left is not started */
#endif
#ifndef CONC
#define CONC 1          /* Batch.Concurrency: groups taking their turn at once (1 or 2) */
#endif
#ifndef MAXCRASH
#define MAXCRASH 1      /* process crashes, in the whole run */
#endif
#ifndef MAXKILL
#define MAXKILL 1       /* invocations killed at their deadline, in the whole run */
#endif
#ifndef MAXFAIL
#define MAXFAIL 1       /* handler errors, in the whole run */
#endif
#ifndef MAXSLOW
#define MAXSLOW 1       /* TIMELY: invocations in which time may pass while work is pending */
#endif

#if CONC != 1 && CONC != 2
#error CONC must be 1 or 2
#endif

#define NREC 3
#define NKEY 2

/* the batch's layout (see the top of the file) */
#define KEY(r)   ((r) == 0 -> 0 : 1)
#define GRP(r)   ((r) == 1 -> GB : GA)
#define OTHER(r) ((r) == 1 -> 2 : 1)   /* the other record of key k */
#define GA 0
#define GB 1

/* store record state */
#define NONE   0
#define INPROG 1
#define DONE   2

/* the up-front claim's outcome, per key */
#define ACQ 1           /* Acquired (a new record, or a takeover of an expired lease) */
#define DUP 2           /* Duplicate: completed */
#define INP 3           /* InProgress: a live claim of another invocation */

/* a record's phase in the current invocation */
#define OUT    0        /* not in a live batch (acked, or between invocations) */
#define TURN   1        /* claimed with the batch, waiting for its turn */
#define WAIT   2        /* a copy waiting for the call of another record of its key */
#define RUN    3        /* its handler runs */
#define SEND   4        /* the handler returned after the effect: its completion is in flight */
#define QUEUED 5        /* MUTANT_COMPLETE_AT_END: effect done, completion queued, not sent */
#define OK     6        /* ended: succeeded (completion landed) or a Duplicate */
#define FAIL   7        /* ended: failed, InProgress or not started; redelivered */

/* ---- the store: one record per key ---- */
byte rst[NKEY];         /* NONE, INPROG, DONE */
byte rtok[NKEY];        /* token of the invocation whose claim wrote the record */
byte rl[NKEY];          /* INPROG: ticks left of the lease; 0 = past it */

/* ---- the broker ---- */
bool acked[NREC];

/* ---- the invocation ---- */
bool alive;             /* an invocation runs the batch */
byte left;              /* ticks left before its deadline */
byte itok;              /* its token: 1..3, one no record refers to (see README.md) */
byte ph[NREC];          /* each record's phase */
byte kres[NKEY];        /* the up-front claim's outcome per key (0: not claimed) */
byte kby[NKEY];         /* 1 + the record that adopted the batch's claim of the key, 0: none */
bool gstop[2];          /* a record of the group failed: its later records do not start */
byte ho;                /* scratch within one step: the record a copy follows; 0 between steps */

/* ---- ghost state: observation only, never read by the protocol ---- */
byte effects[NKEY];     /* how many times the key's effect ran */
byte torn[NKEY];        /* effects whose completion was in flight when their invocation died */
byte crashes;
byte kills;
byte fails;
byte slows;
bool slowinv;           /* TIMELY: this invocation is a slow one */
bool landed;            /* a completion of this invocation has landed */
bool waitbad;           /* a copy started to wait for a call that is not running */
bool ifault;            /* a handler of this invocation returned an error */
bool hungkill;          /* MUTANT_COMPLETE_AT_END: killed while r0's completion was queued and
                           r2's handler was running (always 0 in the other builds) */
bool wasted;            /* TIMELY: an invocation neither slow nor faulty returned with a record
                           not done (failed or not started) */

#define OWNEDK(k)  (rst[k] == INPROG && rl[k] > 0 && rtok[k] == itok)
#define INB(r)     (ph[r] != OUT)
/* the turn of r is over: its handler returned, or it ended */
#define TDONE(r)   (ph[r] == OUT || ph[r] >= SEND)
#define ENDED(r)   (ph[r] == OUT || ph[r] == OK || ph[r] == FAIL)
#define SUCCEEDED(r) (ph[r] == SEND || ph[r] == QUEUED || ph[r] == OK)
#define ALL_ACKED  (acked[0] && acked[1] && acked[2])
#define BATCH_OVER (ENDED(0) && ENDED(1) && ENDED(2))
/* every handler of the batch has returned and no call waits its turn */
#define ALLRET     (TDONE(0) && TDONE(1) && TDONE(2))

#ifdef NO_DEADLINE
#define LATE       false
/* the heartbeat keeps the claims of a live batch */
#define KEPT(k)    (alive && rtok[k] == itok)
#else
#define LATE       (left <= MARGIN)
#define KEPT(k)    false
#endif
/* a lease that the clock runs down */
#define RUNDOWN(k) (rst[k] == INPROG && rl[k] > 0 && !KEPT(k))
#define DEADLEASE  (RUNDOWN(0) || RUNDOWN(1))

/* turn order: groups come in the order of their first record in the batch */
#define FIRSTGRP   (INB(0) -> GA : (INB(1) -> GB : GA))
#define GDONE(g)   ((g) == GA -> (TDONE(0) && TDONE(2)) : TDONE(1))
#if CONC == 2
#define ORDER_OK(g) true
#else
#define ORDER_OK(g) (FIRSTGRP == (g) || GDONE(1 - (g)))
#endif
#define NEXT0 (ph[0] == TURN && ORDER_OK(GA))
#define NEXT1 (ph[1] == TURN && ORDER_OK(GB))
#define NEXT2 (ph[2] == TURN && TDONE(0) && ORDER_OK(GA))

/* the record whose call a copy of k follows */
#ifdef MUTANT_OLD_COPY_RULE
#define FIRSTOF(k)  ((k) == 0 -> 0 : (INB(1) -> 1 : 2))
#define WAITON(r)   FIRSTOF(KEY(r))
#else
#define WAITON(r)   (kby[KEY(r)] - 1)
#endif
#define WAIT_OVER(r) (ph[r] == WAIT && (TDONE(WAITON(r)) || LATE))

inline claim(k) {
	if
	:: rst[k] == DONE -> kres[k] = DUP
	:: rst[k] == INPROG && rl[k] > 0 -> kres[k] = INP;
#ifdef REACH_INPROGRESS
		assert(false);
#endif
		skip
	:: else ->
#ifdef REACH_TAKEOVER
		assert(rst[k] != INPROG);
#endif
		rst[k] = INPROG; rtok[k] = itok; rl[k] = left; kres[k] = ACQ
	fi
}

/* Complete: the lease ends at the deadline and nothing is sent after it,
 * so a completion always finds its own claim: asserted (no heartbeat needed) */
inline complete(k) {
	assert(OWNEDK(k));
	rst[k] = DONE; rl[k] = 0
}

/* Release: compare-and-delete */
inline release(k) {
	if
	:: OWNEDK(k) -> rst[k] = NONE; rtok[k] = 0; rl[k] = 0
	:: else -> skip
	fi
}

/* a record that does not start (its group failed; or StartBy has passed and
 * it would run its handler): its claim is released unless another copy of
 * its key may still take it */
inline not_started(r) {
	ph[r] = FAIL;
#ifdef MUTANT_OLD_COPY_RULE
	if   /* the claim is the first occurrence's */
	:: kres[KEY(r)] == ACQ && kby[KEY(r)] == 0 && FIRSTOF(KEY(r)) == r -> release(KEY(r))
#else
	if
	:: kres[KEY(r)] == ACQ && kby[KEY(r)] == 0 && !(KEY(r) == 1 && ph[OTHER(r)] == TURN) ->
		release(KEY(r));
#ifdef REACH_LATE_RELEASE
		assert(!LATE);
#endif
		skip
#endif
	:: else -> skip
	fi;
	printf("MSC: r%d not started (group stopped %d, ticks left %d): FAIL\n", r, gstop[GRP(r)], left)
}

/* r's key was taken by the call of record ho */
inline copy_of(r) {
	if
	:: (ph[ho] == TURN || ph[ho] == WAIT || ph[ho] == RUN) && LATE ->
		ph[r] = FAIL; gstop[GRP(r)] = 1;   /* a wait that ends at once: InProgress */
		printf("MSC: r%d is a copy of r%d (phase %d), StartBy has passed: InProgress, FAIL\n", r, ho, ph[ho])
	:: (ph[ho] == TURN || ph[ho] == WAIT || ph[ho] == RUN) && !LATE ->
		/* (b) a copy waits only for a call that is running */
		if :: ph[ho] != RUN -> waitbad = 1 :: else -> skip fi;
#ifdef REACH_COPY_WAITS
		assert(false);
#endif
		ph[r] = WAIT;
		printf("MSC: r%d is a copy of r%d (phase %d): waits\n", r, ho, ph[ho])
	:: SUCCEEDED(ho) -> ph[r] = OK;
		printf("MSC: r%d is a copy of r%d, which succeeded: Duplicate\n", r, ho)
	:: ph[ho] == FAIL -> ph[r] = FAIL; gstop[GRP(r)] = 1;
		printf("MSC: r%d is a copy of r%d, which failed: FAIL\n", r, ho)
	fi
}

/* the first call of r's key to take its turn */
inline first_turn(r) {
	if
	:: kres[KEY(r)] == DUP -> ph[r] = OK;
		printf("MSC: r%d: Duplicate\n", r)
	:: kres[KEY(r)] == INP -> ph[r] = FAIL; gstop[GRP(r)] = 1;
		printf("MSC: r%d: InProgress: FAIL\n", r)
	:: kres[KEY(r)] == ACQ && LATE -> not_started(r)   /* StartBy has passed */
	:: kres[KEY(r)] == ACQ && !LATE ->
		assert(OWNEDK(KEY(r)));
#ifdef REACH_COPY_FIRST
		assert(!(r == 2 && ph[1] == TURN));
#endif
		kby[KEY(r)] = r + 1; ph[r] = RUN;
		printf("MSC: r%d takes the batch's claim of key %d: its handler runs\n", r, KEY(r))
	fi
}

#ifdef MUTANT_OLD_COPY_RULE
#define FOLLOW(r) \
	if \
	:: FIRSTOF(KEY(r)) != r -> ho = FIRSTOF(KEY(r)); copy_of(r) \
	:: else -> first_turn(r) \
	fi
#else
#define FOLLOW(r) \
	if \
	:: kby[KEY(r)] != 0 -> ho = kby[KEY(r)] - 1; copy_of(r) \
	:: else -> first_turn(r) \
	fi
#endif

#ifdef MUTANT_COMPLETE_AT_END
#define RETURNED QUEUED
#else
#define RETURNED SEND
#endif

/* the steps of one record, in its group's process */
#define TURN_STEP(r, NX) :: d_step { NX -> \
	if \
	:: gstop[GRP(r)] -> not_started(r) \
	:: else -> FOLLOW(r) \
	fi; \
	ho = 0 }
#define RUN_STEPS(r) \
	:: d_step { ph[r] == RUN -> effects[KEY(r)]++; ph[r] = RETURNED; \
		printf("MSC: r%d handler ok: the effect of key %d runs (effects %d)\n", r, KEY(r), effects[KEY(r)]) } \
	:: d_step { ph[r] == RUN && fails < MAXFAIL -> fails++; ifault = 1; release(KEY(r)); ph[r] = FAIL; gstop[GRP(r)] = 1; \
		printf("MSC: r%d handler error: released\n", r) }
#define WAIT_STEP(r) :: d_step { WAIT_OVER(r) -> \
	ho = WAITON(r); \
	if \
	:: SUCCEEDED(ho) -> ph[r] = OK; \
		printf("MSC: r%d: r%d succeeded: Duplicate\n", r, ho) \
	:: else -> ph[r] = FAIL; gstop[GRP(r)] = 1; \
		printf("MSC: r%d: its wait for r%d ends (ticks left %d): InProgress, FAIL\n", r, ho, left) \
	fi; \
	ho = 0 }

#define FINISHED (ALL_ACKED && !alive)

active proctype GroupA() {
	do
	TURN_STEP(0, NEXT0)
	TURN_STEP(2, NEXT2)
	RUN_STEPS(0)
	RUN_STEPS(2)
	WAIT_STEP(2)
	:: FINISHED -> break
	od
}

active proctype GroupB() {
	do
	TURN_STEP(1, NEXT1)
	RUN_STEPS(1)
	WAIT_STEP(1)
	:: FINISHED -> break
	od
}

/* completions: each lands on its own step (a request that carries several
 * is those steps with nothing in between) */
#define LAND(r) :: d_step { ph[r] == SEND -> complete(KEY(r)); ph[r] = OK; landed = 1; \
	printf("MSC: r%d completion lands: key %d completed\n", r, KEY(r)) }
#define FLUSH(r) if :: ph[r] == QUEUED -> ph[r] = SEND :: else -> skip fi

active proctype Sender() {
	do
	LAND(0)
	LAND(1)
	LAND(2)
#ifdef MUTANT_COMPLETE_AT_END
	:: d_step { alive && ALLRET && (ph[0] == QUEUED || ph[1] == QUEUED || ph[2] == QUEUED) ->
		FLUSH(0); FLUSH(1); FLUSH(2);
		printf("MSC: the batch's last handler returned: the queued completions are sent\n") }
#endif
	:: FINISHED -> break
	od
}

#define ENTER(r) if :: !acked[r] -> ph[r] = TURN :: else -> skip fi
#define ACK(r)   if :: ph[r] == OK -> acked[r] = 1 :: else -> skip fi; ph[r] = OUT
#define TEAR(r)  if :: ph[r] == SEND -> torn[KEY(r)]++ :: else -> skip fi; ph[r] = OUT

/* the invocation dies (killed at its deadline, or crashed): nothing more
 * runs, nothing is acked; completions in flight are lost */
inline die() {
	TEAR(0); TEAR(1); TEAR(2);
	kres[0] = 0; kres[1] = 0; kby[0] = 0; kby[1] = 0; gstop[0] = 0; gstop[1] = 0;
	alive = 0; left = 0; slowinv = 0; landed = 0; ifault = 0
}

#ifdef TIMELY
#define DELIVER_OK (!DEADLEASE)   /* visibility timeout >= the function's timeout */
#else
#define DELIVER_OK true           /* also a retry before the dead invocation's leases end */
#endif

/* the event source and the invocation's entry and exit */
active proctype Broker() {
	do
	:: d_step { !alive && !ALL_ACKED && DELIVER_OK ->
		alive = 1; left = T;
		/* a token no record refers to (as good as a fresh random one) */
		itok = 1;
		do
		:: itok == rtok[0] || itok == rtok[1] -> itok++
		:: else -> break
		od;
		ENTER(0); ENTER(1); ENTER(2);
		if :: ph[0] == TURN -> claim(0) :: else -> skip fi;
		if :: ph[1] == TURN || ph[2] == TURN -> claim(1) :: else -> skip fi;
		printf("MSC: invocation (token %d) gets r0 %d r1 %d r2 %d; claims: x %d, k %d (1 Acquired, 2 Duplicate, 3 InProgress)\n",
			itok, ph[0], ph[1], ph[2], kres[0], kres[1]) }
	:: d_step { alive && BATCH_OVER ->
		/* every exit has sent its completions and releases */
		assert(!OWNEDK(0) && !OWNEDK(1));
#ifdef TIMELY
		if
		:: !slowinv && !ifault && (ph[0] == FAIL || ph[1] == FAIL || ph[2] == FAIL) -> wasted = 1
		:: else -> skip
		fi;
#endif
		ACK(0); ACK(1); ACK(2);
		printf("MSC: invocation returns: acked r0 %d r1 %d r2 %d\n", acked[0], acked[1], acked[2]);
		kres[0] = 0; kres[1] = 0; kby[0] = 0; kby[1] = 0; gstop[0] = 0; gstop[1] = 0;
		alive = 0; left = 0; slowinv = 0; landed = 0; ifault = 0 }
	:: d_step { alive && crashes < MAXCRASH -> crashes++;
		printf("MSC: the process crashes (in flight: r0 %d r1 %d r2 %d)\n", ph[0] == SEND, ph[1] == SEND, ph[2] == SEND);
		die() }
	:: FINISHED -> break
	od
}

#define DEC(k) if :: RUNDOWN(k) -> rl[k]-- :: else -> skip fi

#ifdef NO_DEADLINE
#define TICK_OK DEADLEASE
#else
#define TICK_OK (alive -> (left > 1 || kills < MAXKILL) : DEADLEASE)
#endif

#ifdef TIMELY
#define CANMOVE(r, NX) (NX || ph[r] == RUN || ph[r] == SEND || (ph[r] == QUEUED && ALLRET) || WAIT_OVER(r))
#define URGENT (alive && (CANMOVE(0, NEXT0) || CANMOVE(1, NEXT1) || CANMOVE(2, NEXT2) || BATCH_OVER))
#define SLOW_OK (!URGENT || slowinv)
#else
#define SLOW_OK true
#endif

inline tick() {
	DEC(0); DEC(1);
#ifndef NO_DEADLINE
	if
	:: alive -> left--;
		printf("MSC: tick: %d left before the deadline\n", left);
		if
		:: left == 0 ->
#ifdef REACH_TIMEOUT_AFTER_COMPLETE
			assert(!landed);
#endif
#ifdef MUTANT_COMPLETE_AT_END
			if :: ph[0] == QUEUED && ph[2] == RUN -> hungkill = 1 :: else -> skip fi;
#endif
			kills++;
			printf("MSC: the deadline: the invocation is killed (in flight: r0 %d r1 %d r2 %d)\n",
				ph[0] == SEND, ph[1] == SEND, ph[2] == SEND);
			die()
		:: else -> skip
		fi
	:: else -> printf("MSC: tick\n")
	fi
#endif
}

/* discrete time, kept relative: ticks left before a deadline or a lease's end */
active proctype Clock() {
	do
	:: d_step { TICK_OK && SLOW_OK -> tick() }
#ifdef TIMELY
	:: d_step { TICK_OK && !SLOW_OK && slows < MAXSLOW -> slows++; slowinv = 1;
		printf("MSC: a slow invocation\n"); tick() }
#endif
	:: FINISHED && !DEADLEASE -> break
	od
}

#ifndef NOLTL
/* (a) no second effect for a key, except one per effect whose completion
 *     was in flight when its invocation died */
ltl at_most_once { [] (effects[0] <= 1 + torn[0] && effects[1] <= 1 + torn[1]) }
/* (a') plain at most once: violated (the window exists), a sanity check */
ltl strictly_once { [] (effects[0] <= 1 && effects[1] <= 1) }
/* (b) a copy waits only for a call that is running (never for one that has not started) */
ltl waits_on_running { [] !waitbad }
/* (b) every invocation ends, every record is eventually acked, and each
 *     key's effect ran (TIMELY, weak fairness) */
ltl eventually_done { <> [] (ALL_ACKED && effects[0] >= 1 && effects[1] >= 1) }
/* (b) TIMELY: an invocation in which nothing goes wrong (not slow, no
 *     handler error, no crash) finishes its whole batch */
ltl no_wasted_invocation { [] !wasted }
/* (c) the story of the old design: r0's handler returns, r2's handler runs
 *     until the deadline kills the invocation, and r0's effect runs again.
 *     Violated by MUTANT_COMPLETE_AT_END (a trail to read), never elsewhere */
ltl hang_repeats { [] !(hungkill && effects[0] == 2) }
#endif
