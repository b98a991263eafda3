package linear

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/internal/testsupport/testserver"
	"github.com/watermill-dedup/watermill-dedup/stores/postgres"
)

// withHost returns dsn with its host:port replaced and application_name
// set.
func withHost(t testing.TB, dsn, host, app string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = host
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

// terminateBackends ends every connection of application app (the store's
// pool) with pg_terminate_backend, as an operator or a failover would, and
// returns how many it ended.
func terminateBackends(ctx context.Context, dsn, app string) (int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()) AS t`, app).Scan(&n)
	return n, err
}

// TestLinearPostgres: the PostgreSQL store's history while the server is
// stopped in immediate mode (a crash: no checkpoint, crash recovery on the
// next start) and started again, the store's connections are terminated
// (pg_terminate_backend) and latency is injected (toxiproxy between the
// pool and the server). A witness completes a key before the crash and
// claims it after: the record is there (synchronous_commit on, the
// default, keeps every acknowledged commit through a crash of the server).
func TestLinearPostgres(t *testing.T) {
	t.Parallel()
	pg, err := testserver.StartCrashablePostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Close() })
	u, _ := url.Parse(pg.DSN)
	proxy := newFaultProxy(t, "postgres", u.Host)
	const app = "linear"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, withHost(t, pg.DSN, proxy.Addr(), app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := postgres.New(ctx, postgres.Config{DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tg := newTarget(store)
	w := defaultWorkload("linear:postgres:")
	w.Duration = time.Minute
	w.MaxOps = 1 << 20
	var (
		terminated int
		outcomes   []dedup.Outcome
		latency    toxicCounts
	)
	direct := withHost(t, pg.DSN, u.Host, "linear-nemesis")
	ops := runScenario(t, w, tg, 19, 1500*time.Millisecond, func(t *testing.T, rec *recorder) error {
		for round := 0; round < rounds(2); round++ {
			time.Sleep(700 * time.Millisecond)
			if err := latencyWindow(proxy, 150*time.Millisecond, 30+30*round); err != nil {
				return err
			}
			latency.mu.Lock()
			latency.latency++
			latency.mu.Unlock()
			time.Sleep(300 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			n, err := terminateBackends(ctx, direct, app)
			cancel()
			if err != nil {
				return fmt.Errorf("pg_terminate_backend: %w", err)
			}
			terminated += n
			time.Sleep(500 * time.Millisecond)
			o, err := restartWitness(rec, tg, fmt.Sprintf("linear:postgres:witness-%d", round), func() error {
				if err := pg.StopImmediate(); err != nil {
					return err
				}
				time.Sleep(700 * time.Millisecond) // clients meet a dead server
				return pg.Start()
			})
			if err != nil {
				return err
			}
			outcomes = append(outcomes, o)
		}
		return nil
	})
	t.Logf("faults: %d immediate stops and restarts, %d backends terminated in %d rounds, %d latency windows; the witnesses' claims after each restart: %v",
		len(outcomes), terminated, len(outcomes), latency.latency, outcomes)
	// ClaimBatch decides a record that lost an insert race in a second
	// round trip, after the records behind it: two records of one key in
	// one batch may then take effect out of request order.
	requireLinearizable(t, ops, params{batchAnyOrder: true})
	for _, o := range outcomes {
		if o != dedup.Duplicate {
			t.Errorf("a witness's claim after the restart found %v, want duplicate", o)
		}
	}
}

// latencyWindow adds lat ms (±10) of latency both ways for d.
func latencyWindow(p *faultProxy, d time.Duration, lat int) error {
	for _, stream := range []string{"upstream", "downstream"} {
		if err := p.add("latency-"+stream, "latency", stream, map[string]any{"latency": lat, "jitter": 10}); err != nil {
			return err
		}
	}
	time.Sleep(d)
	for _, stream := range []string{"upstream", "downstream"} {
		if err := p.remove("latency-" + stream); err != nil {
			return err
		}
	}
	return nil
}
