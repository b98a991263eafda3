package postgres

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

// announceSQL is what the completing and releasing statements return per
// row they changed, with Config.Notify: a notification on the key's
// channel (see channelOf), delivered when the transaction commits. $1 is
// the key's hash.
const announceSQL = `pg_notify('dedup_' || encode(substr($1::bytea, 1, 16), 'hex'), '')`

// channelOf is the notification channel of key: "dedup_" and the first 16
// bytes of its hash in hex, 38 bytes, well within PostgreSQL's 63. Keys
// of other tables (and the astronomically rare key that shares the
// prefix) share it: a waiter woken for them claims once for nothing.
func channelOf(key string) string { return "dedup_" + hex.EncodeToString(keyHash(key)[:16]) }

// ErrNotifyNeedsPool is New's error for Config.Notify with a DB that is
// not a *pgxpool.Pool, whose configuration opens the listening connection.
var ErrNotifyNeedsPool = errors.New("postgres: Config.Notify needs a *pgxpool.Pool as the DB (its configuration opens the listening connection)")

// ErrNotifyOff is WatchKey's error without Config.Notify: waiters poll.
var ErrNotifyOff = errors.New("postgres: Config.Notify is off: waiters poll")

// watchLinger is how long the listening connection stays open with no key
// watched.
const watchLinger = 30 * time.Second

var _ dedup.KeyWatcher = (*Store)(nil)

// WatchKey lets the engine wake waiters, with Config.Notify (ErrNotifyOff
// without): a waiter of dedup.Config.InProgressWait is woken when the
// record of key is completed or released, which those statements announce
// with pg_notify. It returns at once. One connection per store, opened at
// the first watch with the pool's configuration (outside the pool) and
// closed after 30s without any watch or by Close, LISTENs on each watched
// key's channel once, however many waiters watch it, and UNLISTENs when
// the last one stops. The LISTEN is confirmed asynchronously: its
// confirmation wakes the waiters, whose claim then covers what happened
// before it. A lost connection (a terminated backend, a restarted server)
// is opened again and its channels listened to again, which wakes their
// waiters. Cost: no round trip on the waiter's path; one LISTEN and one
// UNLISTEN per key watched, on the listening connection.
func (s *Store) WatchKey(_ context.Context, key string, since time.Time) (<-chan struct{}, func(), error) {
	if s.watch == nil {
		return nil, nil, ErrNotifyOff
	}
	return s.watch.Watch(channelOf(key), since)
}

// Close closes the store's listening connection, if any, and waits for its
// goroutine to end; the watches still open are closed (their waiters
// poll), and later ones are refused. It does not close the DB; the store's
// other methods keep working. Calling it more than once is safe.
func (s *Store) Close() error {
	if s.watch != nil {
		s.watch.Close()
	}
	return nil
}

// listener is the transport of a store's watches: one connection that
// LISTENs.
type listener struct {
	config *pgx.ConnConfig
}

func newListener(db DB) (*listener, error) {
	pool, ok := db.(interface{ Config() *pgxpool.Config })
	if !ok {
		return nil, ErrNotifyNeedsPool
	}
	cfg := pool.Config().ConnConfig.Copy()
	// Waiting for a notification is cut short by a context whenever the
	// channels to listen to change: a read deadline does that and keeps
	// the connection, where the default may send a cancel request.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	return &listener{config: cfg}, nil
}

// connectTimeout bounds opening the listening connection.
const connectTimeout = 10 * time.Second

// run keeps a listening connection while h wants channels.
func (l *listener) run(ctx context.Context, h *storekit.WatchHub) {
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, connectTimeout)
		conn, err := pgx.ConnectConfig(cctx, l.config)
		cancel()
		if err == nil {
			attempt = 0
			more := l.serve(ctx, h, conn)
			closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
			if !more {
				return
			}
		}
		if !storekit.SleepCtx(ctx, storekit.WatchBackoff(attempt)) || (len(h.Wanted()) == 0 && h.ExitIfIdle()) {
			return
		}
	}
}

// serve listens on conn until it breaks (true: connect again) or the run
// must end (false).
func (l *listener) serve(ctx context.Context, h *storekit.WatchHub, conn *pgx.Conn) bool {
	listening := map[string]bool{}
	defer func() {
		for name := range listening {
			h.Inactive(name)
		}
	}()
	idle := time.NewTimer(h.Linger())
	defer idle.Stop()
	for {
		if err := l.reconcile(ctx, h, conn, listening); err != nil {
			return ctx.Err() == nil
		}
		wctx, cancel := context.WithCancel(ctx)
		why, helped := make(chan string, 1), make(chan struct{})
		go func() {
			defer close(helped)
			select {
			case <-h.Changed():
				why <- "changed"
				cancel()
			case <-idle.C:
				why <- "idle"
				cancel()
			case <-wctx.Done():
			}
		}()
		n, err := conn.WaitForNotification(wctx)
		cancel()
		<-helped
		if n != nil {
			h.Notify(n.Channel)
		}
		var reason string
		select {
		case reason = <-why:
		default:
		}
		switch {
		case ctx.Err() != nil:
			return false
		case reason == "idle":
			if h.ExitIfIdle() {
				return false
			}
			idle.Reset(h.Linger())
		case reason == "changed":
			idle.Reset(h.Linger())
		case err != nil:
			return true // the connection broke: connect again
		}
	}
}

// reconcile LISTENs to the channels h wants and UNLISTENs the others, in
// one round trip each way.
func (l *listener) reconcile(ctx context.Context, h *storekit.WatchHub, conn *pgx.Conn, listening map[string]bool) error {
	want := map[string]bool{}
	for _, name := range h.Wanted() {
		want[name] = true
	}
	var drop, add []string
	for name := range listening {
		if !want[name] {
			drop = append(drop, name)
		}
	}
	for name := range want {
		if !listening[name] {
			add = append(add, name)
		}
	}
	if len(drop) > 0 {
		if _, err := conn.Exec(ctx, statementsFor("UNLISTEN", drop)); err != nil {
			return err
		}
		for _, name := range drop {
			delete(listening, name)
			h.Unsubscribed(name)
		}
	}
	if len(add) > 0 {
		if _, err := conn.Exec(ctx, statementsFor("LISTEN", add)); err != nil {
			return err
		}
		for _, name := range add {
			listening[name] = true
			h.Active(name)
		}
	}
	return nil
}

// statementsFor is "VERB name; VERB name; ...", names quoted.
func statementsFor(verb string, names []string) string {
	var b strings.Builder
	for _, name := range names {
		b.WriteString(verb)
		b.WriteByte(' ')
		b.WriteString(pgx.Identifier{name}.Sanitize())
		b.WriteString("; ")
	}
	return b.String()
}
