package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/pgtest"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// quietLog discards go-redis' own log lines.
type quietLog struct{}

func (quietLog) Printf(context.Context, string, ...interface{}) {}

// soakMessages is how many messages a soak publishes: SOAK_MESSAGES, or
// 20,000 (`make soak` runs a million).
func soakMessages(t testing.TB) int {
	if s := os.Getenv("SOAK_MESSAGES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1000 {
			t.Fatalf("SOAK_MESSAGES=%q: want a number of messages, at least 1000", s)
		}
		return n
	}
	return 20_000
}

// The shape of a soak.
const (
	copyShare    = 0.25   // of the messages published, copies of an earlier message's key
	killable     = 3      // consumers killed and restarted
	killableSubs = 4      // handlers (group members) of each
	longSubs     = 8      // handlers of the consumer that is never killed
	ahead        = 20_000 // the producer stays at most this many messages ahead of the consumers
)

// TestSoakRedis: a million messages (SOAK_MESSAGES; 20,000 by default)
// through Redis Streams to consumers deduplicating on Redis with AOF
// (appendfsync everysec), consumers SIGKILLed and restarted every one to
// four seconds beside one that lives throughout.
func TestSoakRedis(t *testing.T) { runSoak(t, "redis") }

// TestSoakPostgres is TestSoakRedis with the records in PostgreSQL.
func TestSoakPostgres(t *testing.T) { runSoak(t, "postgres") }

// child is one consumer process.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	ready chan struct{}

	mu     sync.Mutex
	stderr bytes.Buffer
	stats  []stat
}

// stat is one report of the long-lived consumer.
type stat struct {
	messages, rss, goroutines, heap int64
}

type soak struct {
	t          *testing.T
	env        []string
	dir        string
	statsEvery int

	mu     sync.Mutex
	serial int
	kills  map[string]time.Time // consumer name → when it was SIGKILLed
}

func (s *soak) start(subs int, stats bool) *child {
	s.t.Helper()
	s.mu.Lock()
	s.serial++
	name := fmt.Sprintf("c%03d", s.serial)
	s.mu.Unlock()
	every := 0
	if stats {
		every = s.statsEvery
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), s.env...),
		envRole+"=consumer", envName+"="+name, envSubscribers+"="+strconv.Itoa(subs),
		envCompletions+"="+filepath.Join(s.dir, name+".completions"), envStatsEvery+"="+strconv.Itoa(every))
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), ready: make(chan struct{})}
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		s.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stderr = &lockedWriter{mu: &c.mu, w: &c.stderr}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 1 && f[0] == readyLine:
				close(c.ready)
			case len(f) == 5 && f[0] == statsLine:
				var st stat
				st.messages, _ = strconv.ParseInt(f[1], 10, 64)
				st.rss, _ = strconv.ParseInt(f[2], 10, 64)
				st.goroutines, _ = strconv.ParseInt(f[3], 10, 64)
				st.heap, _ = strconv.ParseInt(f[4], 10, 64)
				c.mu.Lock()
				c.stats = append(c.stats, st)
				c.mu.Unlock()
			}
		}
		_ = cmd.Wait()
	}()
	s.t.Cleanup(func() { c.kill() })
	return c
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func runSoak(t *testing.T, store string) {
	n := soakMessages(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()

	brokerSrv, err := testserver.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = brokerSrv.Close() })
	broker := goredis.NewClient(&goredis.Options{Addr: brokerSrv.Addr})
	t.Cleanup(func() { _ = broker.Close() })

	pool, err := pgxpool.New(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	schema := pgtest.Schema(t, pool.Exec, "soak_")
	for _, sql := range []string{
		fmt.Sprintf(`CREATE TABLE %q.effects (id bigserial PRIMARY KEY, key text NOT NULL, token text NOT NULL, consumer text NOT NULL,
			at timestamptz NOT NULL DEFAULT clock_timestamp())`, schema),
		fmt.Sprintf(`CREATE TABLE %q.published (key text PRIMARY KEY)`, schema),
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	stream := "soak-" + watermill.NewShortUUID()
	s := &soak{t: t, dir: t.TempDir(), kills: map[string]time.Time{}, statsEvery: max(100, n/500)}
	s.env = []string{envBroker + "=" + brokerSrv.Addr, envStream + "=" + stream, envStore + "=" + store,
		envDSN + "=" + pgDSN, envSchema + "=" + schema}
	switch store {
	case "redis":
		srv, err := testserver.StartRedisWithArgs("--appendonly", "yes", "--appendfsync", "everysec")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		s.env = append(s.env, envStoreAddr+"="+srv.Addr)
	case "postgres":
		st, err := postgres.New(ctx, postgres.Config{DB: pool, Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := broker.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}

	long := s.start(longSubs, true)
	consumers := make([]*child, killable)
	for i := range consumers {
		consumers[i] = s.start(killableSubs, false)
	}
	for _, c := range append([]*child{long}, consumers...) {
		select {
		case <-c.ready:
		case <-c.done:
			t.Fatalf("consumer %s exited: %s", c.name, c.output())
		case <-time.After(2 * time.Minute):
			t.Fatalf("consumer %s not ready after 2 minutes: %s", c.name, c.output())
		}
	}

	// The killer: every one to four seconds one consumer is SIGKILLed and
	// another started in its place, until every message was read once.
	stopKilling := make(chan struct{})
	killerDone := make(chan struct{})
	var killErr error
	go func() {
		defer close(killerDone)
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		for {
			select {
			case <-stopKilling:
				return
			case <-time.After(time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))):
			}
			i := rng.IntN(len(consumers))
			c := consumers[i]
			if err := c.cmd.Process.Kill(); err != nil {
				killErr = err
				return
			}
			at := time.Now()
			<-c.done
			s.mu.Lock()
			s.kills[c.name] = at
			s.mu.Unlock()
			consumers[i] = s.start(killableSubs, false)
		}
	}()

	// The trimmer keeps the stream to the entries not yet acknowledged.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			trim(ctx, broker, stream)
		}
	}()

	published, distinct, err := produce(ctx, broker, pool, schema, stream, n)
	if err != nil {
		t.Fatal(err)
	}
	produced := time.Since(start)
	// Kills go on until the consumers have read every message once; then
	// the rest drains (the killed consumers' messages, claimed by others).
	for {
		groups, err := broker.XInfoGroups(ctx, stream).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(groups) == 1 && groups[0].Lag == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stopKilling)
	<-killerDone
	if killErr != nil {
		t.Fatal(killErr)
	}
	if err := drain(ctx, broker, stream, 5*time.Minute+time.Duration(n/1000)*time.Second); err != nil {
		for _, c := range append([]*child{long}, consumers...) {
			t.Logf("consumer %s said:\n%s", c.name, c.output())
		}
		t.Fatal(err)
	}
	took := time.Since(start)
	long.mu.Lock()
	stats := append([]stat(nil), long.stats...)
	long.mu.Unlock()

	r, err := s.analyse(ctx, pool, schema)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	kills := len(s.kills)
	s.mu.Unlock()
	flat := flatness(stats, n/10)
	t.Logf("FIGURES store=%s messages=%d distinct_keys=%d copies=%d (%.1f %%) kills=%d effects=%d doubles=%d "+
		"in_crash_window=%d unexplained=%d lost=%d effects_minus_window=%d; long-lived consumer: %s; published in %v, drained after %v (%.0f messages/s)",
		store, published, distinct, published-distinct, 100*float64(published-distinct)/float64(published), kills, r.effects, r.doubles,
		r.window, r.doubles-r.window, r.lost, r.effects-r.window, flat, produced.Round(time.Second), took.Round(time.Second),
		float64(published)/took.Seconds())
	if r.lost != 0 {
		t.Errorf("%d keys published have no effect: lost", r.lost)
	}
	if r.doubles != r.window {
		t.Errorf("%d doubled effects outside the crash window (of %d doubles): %v", r.doubles-r.window, r.doubles, r.unexplained)
	}
	if r.effects-r.window != distinct {
		t.Errorf("effects - doubles in the crash window = %d, want the %d distinct keys", r.effects-r.window, distinct)
	}
	if float64(published-distinct) < 0.2*float64(published) {
		t.Errorf("only %d of %d messages are copies, want at least 20 %%", published-distinct, published)
	}
	if flat.err != nil {
		t.Error(flat.err)
	}
}

// produce publishes n messages, a copyShare of them with the key of an
// earlier one, keeping at most ahead messages ahead of the consumers, and
// records the distinct keys in the published table.
func produce(ctx context.Context, broker *goredis.Client, pool *pgxpool.Pool, schema, stream string, n int) (int, int, error) {
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	var keys []string
	marshal := redisstream.DefaultMarshallerUnmarshaller{}
	const batch = 500
	for sent := 0; sent < n; {
		for {
			groups, err := broker.XInfoGroups(ctx, stream).Result()
			if err != nil {
				return 0, 0, err
			}
			if len(groups) == 1 && int64(sent)-groups[0].EntriesRead < ahead {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		pipe := broker.Pipeline()
		var fresh [][]any
		for i := 0; i < batch && sent < n; i, sent = i+1, sent+1 {
			var key string
			if len(keys) > 0 && rng.Float64() < copyShare {
				key = keys[rng.IntN(len(keys))]
			} else {
				key = fmt.Sprintf("o-%08d", len(keys))
				keys = append(keys, key)
				fresh = append(fresh, []any{admin.ScopedKey(scope, key)})
			}
			payload, _ := json.Marshal(map[string]string{"order_id": key})
			values, err := marshal.Marshal(stream, message.NewMessage(watermill.NewUUID(), payload))
			if err != nil {
				return 0, 0, err
			}
			pipe.XAdd(ctx, &goredis.XAddArgs{Stream: stream, Values: values})
		}
		if _, err := pool.CopyFrom(ctx, pgx.Identifier{schema, "published"}, []string{"key"}, pgx.CopyFromRows(fresh)); err != nil {
			return 0, 0, err
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return 0, 0, err
		}
	}
	return n, len(keys), nil
}

// trim deletes the stream's entries that every consumer acknowledged:
// those before the oldest pending one, or before the last delivered one.
func trim(ctx context.Context, broker *goredis.Client, stream string) {
	groups, err := broker.XInfoGroups(ctx, stream).Result()
	if err != nil || len(groups) != 1 {
		return
	}
	minID := groups[0].LastDeliveredID
	if p, err := broker.XPending(ctx, stream, group).Result(); err == nil && p.Count > 0 && idLess(p.Lower, minID) {
		minID = p.Lower
	}
	if minID != "" && minID != "0-0" {
		_ = broker.XTrimMinID(ctx, stream, minID).Err()
	}
}

func idLess(a, b string) bool {
	pa, pb := strings.SplitN(a, "-", 2), strings.SplitN(b, "-", 2)
	if len(pa) != 2 || len(pb) != 2 {
		return false
	}
	ma, _ := strconv.ParseUint(pa[0], 10, 64)
	mb, _ := strconv.ParseUint(pb[0], 10, 64)
	if ma != mb {
		return ma < mb
	}
	sa, _ := strconv.ParseUint(pa[1], 10, 64)
	sb, _ := strconv.ParseUint(pb[1], 10, 64)
	return sa < sb
}

// drain waits until the group has read every entry and acknowledged every
// one it read; it gives up when nothing moved for a minute.
func drain(ctx context.Context, broker *goredis.Client, stream string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	quiet := 0
	var last goredis.XInfoGroup
	moved := time.Now()
	for {
		groups, err := broker.XInfoGroups(ctx, stream).Result()
		if err != nil {
			return err
		}
		if len(groups) != 1 {
			return fmt.Errorf("the stream has %d groups", len(groups))
		}
		g := groups[0]
		if g.Pending == 0 && g.Lag == 0 {
			if quiet++; quiet == 3 {
				return nil
			}
		} else {
			quiet = 0
		}
		if g.EntriesRead != last.EntriesRead || g.Pending != last.Pending {
			last, moved = g, time.Now()
		}
		if time.Since(moved) > time.Minute {
			return fmt.Errorf("the stream stalled for a minute: %+v", g)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the stream did not drain within %v: %+v", timeout, g)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// result is what the effects table says.
type result struct {
	effects, doubles, window, lost int
	unexplained                    []string // the first few doubles outside the crash window
}

// analyse counts the effects, the keys without one, and the doubles: a
// double is inside the documented crash window when the effect before it
// (of the same key) was written by a consumer that was SIGKILLed before
// its record was completed (its completions file lacks the claim's
// token); any other double is a violation.
func (s *soak) analyse(ctx context.Context, pool *pgxpool.Pool, schema string) (result, error) {
	var r result
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %q.effects`, schema)).Scan(&r.effects); err != nil {
		return r, err
	}
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]q.published p WHERE NOT EXISTS (SELECT FROM %[1]q.effects e WHERE e.key = p.key)`, schema)).Scan(&r.lost); err != nil {
		return r, err
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT key, token, consumer, at FROM %[1]q.effects
		WHERE key IN (SELECT key FROM %[1]q.effects GROUP BY key HAVING count(*) > 1) ORDER BY key, at, id`, schema))
	if err != nil {
		return r, err
	}
	type effect struct {
		key, token, consumer string
		at                   time.Time
	}
	var all []effect
	for rows.Next() {
		var e effect
		if err := rows.Scan(&e.key, &e.token, &e.consumer, &e.at); err != nil {
			return r, err
		}
		all = append(all, e)
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	completions := map[string]map[string]bool{}
	completed := func(consumer, token string) bool {
		if _, ok := completions[consumer]; !ok {
			set := map[string]bool{}
			b, _ := os.ReadFile(filepath.Join(s.dir, consumer+".completions"))
			for _, l := range strings.Split(string(b), "\n") {
				set[l] = true
			}
			completions[consumer] = set
		}
		return completions[consumer][token]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 1; i < len(all); i++ {
		prev, e := all[i-1], all[i]
		if prev.key != e.key {
			continue
		}
		r.doubles++
		// A consumer writes nothing once killed: its effect's statement
		// was sent before the kill (PostgreSQL may run it after).
		killed, ok := s.kills[prev.consumer]
		if ok && !completed(prev.consumer, prev.token) {
			r.window++
			continue
		}
		if len(r.unexplained) < 5 {
			r.unexplained = append(r.unexplained, fmt.Sprintf("%s: %s by %s at %s (killed %v at %s, completed %v), then %s by %s at %s",
				e.key, prev.token, prev.consumer, prev.at.Format(time.StampMicro), ok, killed.Format(time.StampMicro),
				completed(prev.consumer, prev.token), e.token, e.consumer, e.at.Format(time.StampMicro)))
		}
	}
	return r, nil
}

// flat is the long-lived consumer's memory and goroutines, compared
// between its second window of messages and its last full one (the most
// of each within the window: a garbage collector's sawtooth does not
// count as growth). A window is a tenth of the messages published.
type flat struct {
	window, windows, messages  int64
	rss2, rssLast, gr2, grLast int64
	err                        error
}

func (f flat) String() string {
	if f.windows < 3 {
		return fmt.Sprintf("%d messages (%d windows of %d)", f.messages, f.windows, f.window)
	}
	return fmt.Sprintf("%d messages; RSS %.1f MB in its messages %d-%d, %.1f MB in %d-%d (%+.1f %%); goroutines %d, then %d (%+.1f %%)",
		f.messages, float64(f.rss2)/(1<<20), f.window+1, 2*f.window, float64(f.rssLast)/(1<<20), (f.windows-1)*f.window+1, f.windows*f.window,
		growth(f.rss2, f.rssLast), f.gr2, f.grLast, growth(f.gr2, f.grLast))
}

func growth(a, b int64) float64 { return 100 * (float64(b) - float64(a)) / float64(a) }

func flatness(stats []stat, window int) flat {
	f := flat{window: int64(window)}
	if len(stats) > 0 {
		f.messages = stats[len(stats)-1].messages
	}
	f.windows = f.messages / f.window
	if f.windows < 3 {
		f.err = fmt.Errorf("the long-lived consumer handled %d messages, fewer than 3 windows of %d: nothing to compare", f.messages, f.window)
		return f
	}
	in := func(w int64) (rssMax, grMax int64) {
		for _, s := range stats {
			if s.messages > (w-1)*f.window && s.messages <= w*f.window {
				rssMax, grMax = max(rssMax, s.rss), max(grMax, s.goroutines)
			}
		}
		return
	}
	f.rss2, f.gr2 = in(2)
	f.rssLast, f.grLast = in(f.windows)
	// Windows of a few thousand messages (the short run) fall in the
	// process's warm-up: connection pools filling, the race detector's
	// shadow memory; RSS is judged on windows of 50,000 messages or more.
	if g := growth(f.rss2, f.rssLast); g >= 10 && f.window >= 50_000 {
		f.err = fmt.Errorf("the long-lived consumer's RSS grew %.1f %% (%s)", g, f)
	}
	if g := growth(f.gr2, f.grLast); g >= 10 {
		f.err = fmt.Errorf("the long-lived consumer's goroutines grew %.1f %% (%s)", g, f)
	}
	return f
}
