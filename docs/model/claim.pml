/*
 * claim.pml: a Promela model of the watermill-dedup claim protocol
 * (/DESIGN.md "Store operations" and "The middleware, message by message").
 *
 * One business key, one record in the store, NMSG broker messages carrying
 * that key (the original and a producer retry), NCONS consumers running the
 * middleware, a heartbeat goroutine per consumer, a broker and a clock.
 *
 * Run it with docs/model/model_test.go, or by hand (see README.md):
 *   spin -a [-DNAME ...] claim.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan -N at_most_once
 *
 * Variants (spin -DNAME):
 *   NO_HEARTBEAT            no Extend (Config.DisableHeartbeat): the deadline still cancels the
 *                           handler, but nothing holds the lease while Complete is retried
 *   PAUSES                  whole-process pauses: no timer is urgent, so the heartbeat and
 *                           Complete/Release may come after the lease has ended
 *   TXN_COMPLETE            the effect and Complete commit in one transaction (PostgreSQL store),
 *                           so no crash can fall between them
 *   FENCED                  every winning claim gets a fence (larger than every earlier
 *                           winner's) and the effect is a write to a downstream that keeps the
 *                           largest fence it accepted and refuses a smaller one; a refused
 *                           write makes the handler return an error (the claim is lost)
 *   MUTANT_FENCE_REUSE      (FENCED) a takeover of a record whose lease ended gets the fence of
 *                           the claim it replaces instead of a larger one
 *   MUTANT_NO_FENCE_CHECK   (FENCED) the downstream accepts every write (no fence condition)
 *   REACH_FENCE_REFUSED     (FENCED) sanity: assert that the downstream never refuses a write
 *   MUTANT_RELEASE_NO_TOKEN Release deletes the record without comparing the token
 *   MUTANT_ACK_INPROGRESS   an InProgress copy is acked instead of nacked
 *   MUTANT_LATE_CANCEL      the code before the lease engine (9525892): no deadline timer; the
 *                           lease's end is only checked when a failed Extend returns
 *   MUTANT_HB_STOPS_AT_COMPLETE  the code before the lease engine: the heartbeat stops when the
 *                           handler returns, before Complete is acknowledged
 *   REACH_TAKEOVER          sanity: assert that no Claim ever takes over an expired lease
 *   REACH_LONG_HANDLER      sanity: assert that no handler outlives one lease
 *   REACH_FOREIGN_REFUSED   sanity: assert that no Complete/Release/Extend ever meets a
 *                           record owned by another claim
 *   NOLTL                   leave out the ltl blocks (for the REACH_ runs)
 * Bounds (spin -DNAME=value): NCONS (2..3), NMSG (1..2), LEASE, HB (heartbeat
 * interval), MARGIN (the deadline is MARGIN ticks before the lease's end),
 * MAXCRASH, MAXFAIL, MAXNET.
 */

#ifndef NCONS
#define NCONS 3         /* consumers (one handler goroutine each) */
#endif
#ifndef NMSG
#define NMSG 2          /* broker messages with the same business key */
#endif
#ifndef LEASE
#define LEASE 3         /* lease, in clock ticks */
#endif
#ifndef MARGIN
#define MARGIN 1        /* the handler is cancelled MARGIN ticks before the lease ends (min(Lease/10, 1s)) */
#endif
#ifndef HB
#define HB 1            /* heartbeat interval, in clock ticks (Config: Heartbeat < Lease) */
#endif
#ifndef MAXCRASH
#define MAXCRASH 1      /* consumer crashes, in the whole run */
#endif
#ifndef MAXFAIL
#define MAXFAIL 1       /* handler errors (transient failures), in the whole run */
#endif
#ifndef MAXNET
#define MAXNET 1        /* store requests lost on the network (an Extend that hangs until its
                           context ends, a Complete that fails and is retried), in the whole run */
#endif

#define NTOK (NCONS + 1) /* token values 1..NTOK; 0 = no token */

/* record state */
#define NONE   0
#define INPROG 1
#define DONE   2

/* Claim outcome */
#define ACQUIRED   1
#define INPROGRESS 2
#define DUPLICATE  3

/* consumer phase (read by the broker and the clock) */
#define IDLE 0          /* waiting for the broker */
#define GOT  1          /* a copy is in hand: claim, ack or nack pending */
#define RUN  2          /* claim acquired, handler running, heartbeat running */
#define FIN  3          /* handler returned, Complete/Release not yet issued */

/* ---- the store: one record for the one scoped key ---- */
byte rstate;            /* NONE, INPROG or DONE */
byte rtok;              /* owner token written by the claim that created the record */
byte rlease;            /* INPROG: ticks left before the lease deadline; 0 = past the lease */
/* A completed record never expires here: retention is assumed to cover the
 * redelivery window (Config.Retention); see README.md. */

/* ---- the broker ---- */
bool acked[NMSG];

/* ---- consumers ---- */
byte ph[NCONS];         /* phase */
byte msg[NCONS];        /* message in hand */
byte tok[NCONS];        /* token of the consumer's current claim, 0 = none */
bool hb[NCONS];         /* heartbeat running */
byte hbt[NCONS];        /* ticks until the next heartbeat */
bool cancel[NCONS];     /* handler context cancelled (claim lost, or the deadline passed) */
byte lt[NCONS];         /* ticks left of the lease as the consumer knows it (from before its
                           last successful Claim/Extend was sent); the deadline is lt <= MARGIN */
bool hung[NCONS];       /* an Extend is in flight and will fail (its request was lost) */
bool retry[NCONS];      /* a Complete attempt failed: the next one comes after a backoff */

/* ---- ghost state: observation only, never read by the protocol ---- */
byte effects;           /* how many times the handler's effect ran */
byte torn;              /* crashes between an effect and its Complete */
byte crashes;
byte fails;
byte nets;
bool mine[NCONS];       /* spec of ownership: the record was created by i's current claim */
bool foreign;           /* some Complete/Release/Extend changed a record it did not own */
#ifdef REACH_LONG_HANDLER
byte span[NCONS];       /* ticks the current handler has been running */
#endif

#ifdef FENCED
/* ---- fences (FENCED) ----
 * Fences are kept *relative*: only their order matters (the downstream
 * compares them, the store gives a new one above all), so after every
 * change the values in use are renumbered 1, 2, ... in order (compact):
 * the state space stays finite, the comparisons are unchanged. */
byte rfence;            /* the fence of the key's last winning claim: the store keeps it with the
                           record, through release and takeover (deletion after retention, where
                           a clock takes over, is not modelled) */
byte fen[NCONS];        /* the fence of the consumer's current claim, 0 = none */
byte dfence;            /* the downstream: the largest fence it accepted for the key, 0 = none */
/* ghost: claim order, kept independently of the fences */
bool older[NCONS * NCONS];  /* older[a*NCONS+b]: a's current claim won before b's current claim */
bool overtaken[NCONS];  /* a claim that won after i's current one has had its write accepted */
bool late;              /* the downstream accepted the write of a claim after a later claim's write */
#endif

#if NCONS == 2
#define HELD(t)   (tok[0] == t || tok[1] == t)
#define URGENT    (UR(0) || UR(1))
#define HUNG_ANY  (hung[0] || hung[1])
#define HB_ANY    (hb[0] || hb[1])
#define FORALL(M) M(0); M(1)
#elif NCONS == 3
#define HELD(t)   (tok[0] == t || tok[1] == t || tok[2] == t)
#define URGENT    (UR(0) || UR(1) || UR(2))
#define HUNG_ANY  (hung[0] || hung[1] || hung[2])
#define HB_ANY    (hb[0] || hb[1] || hb[2])
#define FORALL(M) M(0); M(1); M(2)
#else
#error NCONS must be 2 or 3
#endif

#if NMSG == 1
#define ALL_ACKED (acked[0])
#elif NMSG == 2
#define ALL_ACKED (acked[0] && acked[1])
#else
#error NMSG must be 1 or 2
#endif

/* The lease keeper (dedup/lease.go) is one timer: the next extension or
 * the deadline, whichever comes first; at the deadline (lt <= MARGIN) it
 * extends no more, and cancels the handler unless Complete is under way. */
#define BEAT_OK(i)     (hb[i] && !hung[i] && lt[i] > MARGIN)
#ifdef MUTANT_LATE_CANCEL
#define DL_DUE(i)      false    /* no deadline timer */
#else
#define DL_DUE(i)      (ph[i] == RUN && tok[i] != 0 && lt[i] <= MARGIN && !cancel[i])
#endif

/* A timer that is due blocks the clock: a heartbeat whose interval has
 * elapsed, the deadline, and a handler that has returned (the first
 * Complete/Release attempt is one round trip, much shorter than the lease;
 * a retry after a store error waits for its backoff, which may be long).
 * An Extend that hangs returns whenever: it is not urgent. With PAUSES
 * nothing is urgent: a paused process lets any amount of time pass. */
#ifdef PAUSES
#define TICK_OK        true
#define HB_DUE(i)      BEAT_OK(i)   /* the heartbeat comes at any time, early or (too) late */
#define HB_ARM(i)      skip
#else
#define UR(i)          ((BEAT_OK(i) && hbt[i] == 0) || DL_DUE(i) || (ph[i] == FIN && !retry[i]))
#define TICK_OK        (!URGENT)
#define HB_DUE(i)      (BEAT_OK(i) && hbt[i] == 0)
#define HB_ARM(i)      hbt[i] = HB
#endif

/* the store keeps the record live and carrying the caller's token */
#define OWNED(i) (rstate == INPROG && rlease > 0 && rtok == tok[i])

#define CLEARMINE(j) mine[j] = 0

#ifdef FENCED
/* is value v (1..) held anywhere? */
#if NCONS == 2
#define FUSED(v) (rfence == v || dfence == v || fen[0] == v || fen[1] == v)
#else
#define FUSED(v) (rfence == v || dfence == v || fen[0] == v || fen[1] == v || fen[2] == v)
#endif
#define FSHIFT(j) if :: fen[j] > t -> fen[j]-- :: else -> skip fi
/* renumber the fences in use 1, 2, ... keeping their order (uses the
 * consumer's local t, which is 0 outside claim) */
#define COMPACT t = 1; \
	do \
	:: t > rfence -> break \
	:: t <= rfence && FUSED(t) -> t++ \
	:: t <= rfence && !FUSED(t) -> rfence--; FORALL(FSHIFT); \
		if :: dfence > t -> dfence-- :: else -> skip fi \
	od; t = 0
/* consumer i's new claim won after every other current claim */
#define ORDER(j) if :: j != i && tok[j] != 0 -> older[j * NCONS + i] = 1 :: else -> older[j * NCONS + i] = 0 fi; \
	older[i * NCONS + j] = 0
/* consumer i's claim is gone */
#define UNORDER(j) older[j * NCONS + i] = 0; older[i * NCONS + j] = 0
/* consumer i's write was accepted: every older current claim is overtaken */
#define OVERTAKE(j) if :: older[j * NCONS + i] -> overtaken[j] = 1 :: else -> skip fi
#endif
#define DEC(j)  if :: hb[j] && hbt[j] > 0 -> hbt[j]-- :: else -> skip fi; \
	if :: lt[j] > 0 -> lt[j]-- :: else -> skip fi
#ifdef REACH_LONG_HANDLER
#define SPAN(j) if :: ph[j] == RUN && span[j] <= LEASE -> span[j]++ :: else -> skip fi
#endif

/* a record that counts: in_progress within its lease, or completed */
#define LIVE ((rstate == INPROG && rlease > 0) || rstate == DONE)

/* ownership spec, checked on every write by Complete/Release/Extend: a live
 * record may only be changed by the claim that created it (an expired one
 * counts as no record, so changing it harms nobody) */
#define WRITE_BY(i) if :: LIVE && !mine[i] -> foreign = 1 :: else -> skip fi

#ifdef REACH_FOREIGN_REFUSED
/* sanity: the token check does turn away a call on a live record owned by another claim */
#define REFUSED(i) assert(!(LIVE && rtok != tok[i]))
#else
#define REFUSED(i) skip
#endif

/* Claim(key, lease): one atomic round trip */
inline claim(i) {
	if
	:: rstate == DONE -> res = DUPLICATE;
		printf("MSC: C%d claims m%d: Duplicate\n", i, msg[i])
	:: rstate == INPROG && rlease > 0 -> res = INPROGRESS;
		printf("MSC: C%d claims m%d: InProgress\n", i, msg[i])
	:: else ->
		/* no record, or an in_progress record past its lease: takeover */
#ifdef REACH_TAKEOVER
		assert(rstate != INPROG);
#endif
		/* a new token: any value no record or claim refers to is as good as a fresh random one */
		t = 1;
		do
		:: t == rtok || HELD(t) -> t++
		:: else -> break
		od;
#if defined(FENCED) && defined(MUTANT_FENCE_REUSE)
		/* the mutant: a takeover keeps the replaced claim's fence */
		if :: rstate == INPROG && rfence > 0 -> fen[i] = rfence :: else -> rfence++; fen[i] = rfence fi;
#elif defined(FENCED)
		rfence++; fen[i] = rfence;      /* storekit.NextFence: larger than every earlier one */
#endif
		rstate = INPROG; rtok = t; rlease = LEASE;
		tok[i] = t; t = 0; lt[i] = LEASE;
#ifdef FENCED
		FORALL(ORDER); overtaken[i] = 0;
		COMPACT;
#endif
		FORALL(CLEARMINE); mine[i] = 1;
		ph[i] = RUN;
#ifndef NO_HEARTBEAT
		hb[i] = 1; HB_ARM(i);
#endif
		res = ACQUIRED;
		printf("MSC: C%d claims m%d: Acquired, token %d\n", i, msg[i], tok[i])
	fi
}

#ifdef FENCED
/* the effect: a write to the downstream with the claim's fence; it keeps
 * the largest fence it accepted and refuses a smaller one (WHERE
 * charges.fence <= EXCLUDED.fence). ok: accepted. */
inline write(i) {
	if
#ifdef MUTANT_NO_FENCE_CHECK
	:: true ->
#else
	:: fen[i] >= dfence ->
#endif
		if :: overtaken[i] -> late = 1 :: else -> skip fi;
		dfence = fen[i]; FORALL(OVERTAKE);
		effects++; ok = 1;
		printf("MSC: C%d writes with fence %d: accepted (effects=%d)\n", i, fen[i], effects)
	:: else ->
#ifdef REACH_FENCE_REFUSED
		assert(fen[i] >= dfence);
#endif
		ok = 0;
		printf("MSC: C%d writes with fence %d: refused, the downstream holds %d: the handler returns an error\n", i, fen[i], dfence)
	fi;
	COMPACT
}
#endif

/* Complete(claim): only if the record still carries the claim's token */
inline complete(i) {
	if
	:: OWNED(i) -> WRITE_BY(i); rstate = DONE; rlease = 0
	:: else -> REFUSED(i)   /* ErrClaimLost */
	fi
}

inline delete_record() {
	rstate = NONE; rtok = 0; rlease = 0; FORALL(CLEARMINE)
}

/* Release(claim): compare-and-delete */
inline release(i) {
#ifdef MUTANT_RELEASE_NO_TOKEN
	if
	:: rstate != NONE -> WRITE_BY(i); delete_record()   /* plain DEL key */
	:: else -> skip
	fi
#else
	if
	:: OWNED(i) -> WRITE_BY(i); delete_record()
	:: else -> REFUSED(i)   /* ErrClaimLost */
	fi
#endif
}

/* Extend(claim, lease): only if the token matches. A claim_lost while
 * Complete is under way (ph == FIN) is not reported: Complete decides. */
inline extend(i) {
	if
	:: OWNED(i) -> WRITE_BY(i); rlease = LEASE; lt[i] = LEASE; HB_ARM(i)
	:: else -> REFUSED(i); hb[i] = 0; hbt[i] = 0;
		if :: ph[i] == RUN -> cancel[i] = 1 :: else -> skip fi   /* claim lost: cancel the handler */
	fi
}

/* a hung Extend fails when its context ends (at the deadline at the
 * latest): the keeper arms its next timer; past the deadline it stops */
inline extend_failed(i) {
	hung[i] = 0;
	if
	:: lt[i] > MARGIN -> hbt[i] = 0     /* the next extension is due at once */
	:: else ->
#ifdef MUTANT_LATE_CANCEL
		/* 9525892: the lease's end was checked here, and only here */
		if :: lt[i] == 0 && ph[i] == RUN -> cancel[i] = 1; hb[i] = 0 :: else -> skip fi
#else
		hb[i] = 0
#endif
	fi
}

#ifdef REACH_LONG_HANDLER
#define RESET_SPAN(i) span[i] = 0
#else
#define RESET_SPAN(i) skip
#endif

/* the consumer's in-flight state is gone: after ack, nack or crash */
#ifdef FENCED
#define RESET_FENCE(i) ; fen[i] = 0; overtaken[i] = 0; FORALL(UNORDER); COMPACT
#else
#define RESET_FENCE(i)  /* nothing: the other builds' state spaces stay as they were */
#endif
#define RESET(i) ph[i] = IDLE; msg[i] = 0; tok[i] = 0; hb[i] = 0; hbt[i] = 0; \
	cancel[i] = 0; lt[i] = 0; hung[i] = 0; retry[i] = 0; mine[i] = 0; RESET_SPAN(i); res = 0; ok = 0 \
	RESET_FENCE(i)

#define CAN_CRASH (crashes < MAXCRASH)

/* the dedup middleware around one handler; consumer i has _pid i */
active [NCONS] proctype Consumer() {
	byte i = _pid;
	byte res, t;
	bool ok;
end_idle:
	(ph[i] == GOT);
	if
	:: CAN_CRASH -> goto crash
	:: d_step { claim(i) }
	fi;
	if
	:: res == ACQUIRED -> skip      /* run the handler */
	:: res == DUPLICATE -> goto ack /* ack without effect */
	:: res == INPROGRESS ->
#ifdef MUTANT_ACK_INPROGRESS
		goto ack
#else
		goto nack                   /* ErrInProgress: never ack */
#endif
	fi;
	/* handler running (ph == RUN), heartbeat running */
	if
	:: CAN_CRASH -> goto crash
#ifdef TXN_COMPLETE
	/* effect and Complete in one transaction: it commits only while the claim is owned */
	:: d_step { !cancel[i] ->
		if
		:: OWNED(i) -> effects++; complete(i); ok = 1
		:: else -> ok = 0
		fi;
		hb[i] = 0; hbt[i] = 0; ph[i] = GOT;
		printf("MSC: C%d handler ok: effect + Complete in one transaction, committed %d (effects=%d)\n", i, ok, effects)
		}
		if
		:: ok -> goto ack
		:: else -> goto nack
		fi
#else
#ifdef FENCED
	:: d_step { !cancel[i] -> write(i); ph[i] = FIN }
#else
	:: d_step { !cancel[i] -> effects++; ok = 1; ph[i] = FIN;
#ifdef MUTANT_HB_STOPS_AT_COMPLETE
		hb[i] = 0; hbt[i] = 0;
#endif
		printf("MSC: C%d handler ok, the effect runs (effects=%d)\n", i, effects) }
#endif
#endif
	:: d_step { (fails < MAXFAIL || cancel[i]) ->
		if :: !cancel[i] -> fails++ :: else -> skip fi;
		ok = 0; ph[i] = FIN;
		printf("MSC: C%d handler error (cancelled %d)\n", i, cancel[i]) }
	fi;
#ifdef REACH_LONG_HANDLER
	assert(span[i] <= LEASE);
#endif
	/* handler returned (ph == FIN); the heartbeat runs until Complete or
	 * Release is acknowledged */
fin:
	if
	:: CAN_CRASH -> goto crash
	:: d_step { ok && nets < MAXNET -> nets++; retry[i] = 1;
		printf("MSC: C%d Complete: store error, retried after a backoff\n", i) }
		goto fin
	:: d_step { ok -> complete(i); ph[i] = GOT; hb[i] = 0; hbt[i] = 0; hung[i] = 0; retry[i] = 0;
		printf("MSC: C%d Complete -> record state %d token %d\n", i, rstate, rtok) }
		goto ack    /* ack even if Complete failed: a nack would run the effect again */
	:: d_step { !ok -> release(i); ph[i] = GOT; hb[i] = 0; hbt[i] = 0; hung[i] = 0;
		printf("MSC: C%d Release -> record state %d\n", i, rstate) }
		goto nack
	fi;
ack:
	if
	:: CAN_CRASH -> goto crash
	:: d_step { printf("MSC: C%d ack m%d\n", i, msg[i]); acked[msg[i]] = 1; RESET(i) }
		goto end_idle
	fi;
nack:
	atomic { printf("MSC: C%d nack m%d\n", i, msg[i]); RESET(i) }
	goto end_idle;
crash:
	atomic {
		printf("MSC: C%d crashes (phase %d)\n", i, ph[i]);
		crashes++;
		if :: ph[i] == FIN && ok -> torn++ :: else -> skip fi;
		RESET(i)
	}
	goto end_idle
}

/* the lease keepers (one per consumer, folded into one process): Extend
 * every HB ticks from the claim until Complete/Release is acknowledged (an
 * Extend may be lost on the network: it hangs, then fails), and cancel the
 * handler at the deadline */
#ifdef NO_HEARTBEAT
#define HEARTBEAT(i)
#else
#define HEARTBEAT(i) :: d_step { HB_DUE(i) -> extend(i); \
	printf("MSC: C%d heartbeat: Extend, claim held %d\n", i, hb[i]) } \
	:: d_step { HB_DUE(i) && nets < MAXNET -> nets++; hung[i] = 1; \
	printf("MSC: C%d heartbeat: Extend sent, the network loses it\n", i) } \
	:: d_step { hung[i] -> extend_failed(i); \
	printf("MSC: C%d heartbeat: the lost Extend fails (lease left %d)\n", i, lt[i]) }
#endif
#define DEADLINE(i) :: d_step { DL_DUE(i) -> cancel[i] = 1; hb[i] = 0; hbt[i] = 0; \
	printf("MSC: C%d deadline: no extension succeeded, the handler is cancelled\n", i) }

#if !(defined(NO_HEARTBEAT) && defined(MUTANT_LATE_CANCEL))
active proctype Heartbeats() {
end_hb:
	do
	HEARTBEAT(0)
	HEARTBEAT(1)
#if NCONS == 3
	HEARTBEAT(2)
#endif
#ifndef MUTANT_LATE_CANCEL
	DEADLINE(0)
	DEADLINE(1)
#if NCONS == 3
	DEADLINE(2)
#endif
#endif
	od
}
#endif

/* at-least-once broker: any un-acked message may be handed to any idle
 * consumer at any time, whether or not it is already in flight elsewhere
 * (visibility timeout, rebalance, nack, crash) */
#define DELIVER(c, m) :: d_step { ph[c] == IDLE && !acked[m] -> ph[c] = GOT; msg[c] = m; \
	printf("MSC: broker delivers m%d to C%d\n", m, c) }

active proctype Broker() {
end_broker:
	do
	DELIVER(0, 0)
	DELIVER(1, 0)
#if NCONS == 3
	DELIVER(2, 0)
#endif
#if NMSG == 2
	DELIVER(0, 1)
	DELIVER(1, 1)
#if NCONS == 3
	DELIVER(2, 1)
#endif
#endif
	od
}

/* discrete time: each tick brings the lease deadline and every heartbeat
 * timer one step closer. Time is kept relative (ticks left), so it never
 * runs out and the state space stays finite; and it never stops (a tick is
 * possible in every state but those with a due timer), so under weak
 * fairness every lease eventually ends. */
active proctype Clock() {
end_clock:
	do
	:: d_step { TICK_OK ->
		if
		:: rstate == INPROG && rlease > 0 -> rlease--;
			printf("MSC: tick: lease of token %d has %d tick(s) left\n", rtok, rlease)
		:: else -> skip
		fi;
		FORALL(DEC);
#ifdef REACH_LONG_HANDLER
		FORALL(SPAN);
#endif
		}
	od
}

#ifndef NOLTL
/* 1. at most once while leases hold: no second effect, except one per crash
 *    that falls between an effect and its Complete */
ltl at_most_once { [] (effects <= 1 + torn) }
/* 1'. strictly at most once (holds with TXN_COMPLETE) */
ltl strictly_once { [] (effects <= 1) }
/* 2. every message is eventually acked and the effect has run (once, but for torn crashes) */
ltl eventually_once { <> [] (ALL_ACKED && effects >= 1 && effects <= 1 + torn) }
/* 3. Complete/Release/Extend only ever change a record their own claim created */
ltl owner_only { [] !foreign }
#ifdef FENCED
/* 4. the downstream never accepts a claim's write once a later claim's write is in:
 *    a holder that paused for any time is refused once its successor has written */
ltl fenced_order { [] !late }
#endif
#endif
