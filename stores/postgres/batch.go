package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/dedup/admin"
	"github.com/watermill-dedup/watermill-dedup/dedup/storekit"
)

var _ dedup.BatchStore = (*Store)(nil)

// BatchRequestSize is the most statements one request of the batch
// methods carries; a larger batch is sent as several requests, one after
// the other.
const BatchRequestSize = 500

// batchSender is what the batch methods need of the DB to send many
// statements in one round trip (*pgxpool.Pool, *pgx.Conn and pgx.Tx
// have it).
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ClaimBatch implements [dedup.BatchStore.ClaimBatch]: the claim statement
// of every record (Claim's, unchanged) queued in one pgx.Batch and sent in
// one round trip (per BatchRequestSize records). The server runs them in
// one implicit transaction, in the order of the records' key hashes (so
// that two batches sharing keys lock them in the same order and never
// deadlock): the same key twice in a batch is claimed as two claims one
// after the other. If a statement fails the transaction claims nothing,
// and every record of the request gets the error. A record that lost a
// race with a concurrent first claim (Claim's second statement) is
// claimed again with the locking statement, in a second round trip for
// all of them. Each record it wins carries its fence, as Claim's.
//
// A DB without SendBatch (see batchSender) gets one Claim per record.
func (s *Store) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.ClaimResult, []error) {
	res, errs := make([]dedup.ClaimResult, len(reqs)), make([]error, len(reqs))
	sender, ok := s.db.(batchSender)
	if !ok {
		for i, r := range reqs {
			res[i], errs[i] = s.Claim(dedup.WithOrigin(ctx, r.Origin), r.Key, r.Fingerprint, r.Lease)
		}
		return res, errs
	}
	type rec struct {
		i                  int
		token, fingerprint string
		args               []any
		got                claimRow
	}
	var recs []*rec
	for i, r := range reqs {
		if errs[i] = storekit.CheckDuration("lease", r.Lease); errs[i] != nil {
			continue
		}
		c := &rec{i: i, token: storekit.NewToken(), fingerprint: storedFingerprint(r.Fingerprint)}
		scope, business := admin.SplitScopedKey(r.Key)
		c.args = []any{keyHash(r.Key), r.Key, c.token, c.fingerprint, micros(r.Lease), scope, business, nullText(r.Origin.TransportID), nullText(r.Origin.MessageID)}
		recs = append(recs, c)
	}
	slices.SortStableFunc(recs, func(a, b *rec) int { return bytes.Compare(a.args[0].([]byte), b.args[0].([]byte)) })
	pending := recs
	for _, sql := range []string{s.sql.claim, s.sql.claimLocked} {
		if len(pending) == 0 {
			break
		}
		var raced []*rec
		s.sendBatch(ctx, sender, "claim", len(pending), func(b *pgx.Batch, k int) {
			b.Queue(sql, pending[k].args...)
		}, func(br pgx.BatchResults, k int) error {
			c := pending[k]
			return br.QueryRow().Scan(c.got.dest()...)
		}, func(k int, err error) {
			c := pending[k]
			switch {
			case errors.Is(err, pgx.ErrNoRows): // lost a race; nothing was written
				s.fallbacks.Add(1)
				raced = append(raced, c)
			case err != nil:
				errs[c.i] = notMigrated(err)
			default:
				res[c.i], errs[c.i] = claimOutcome(reqs[c.i].Key, c.token, c.fingerprint, c.got)
			}
		})
		pending = raced
	}
	return res, errs
}

// claimOutcome decides a claim statement's answer, as Claim does: the
// claim won when the row carries its token, and then the row's fence is
// the claim's.
func claimOutcome(key, token, fingerprint string, got claimRow) (dedup.ClaimResult, error) {
	switch {
	case got.token == token:
		return dedup.ClaimResult{Outcome: dedup.Acquired, Claim: dedup.Claim{Key: key, Token: token, Fence: uint64(got.fence)}}, nil
	case fingerprint != "" && got.fingerprint != "" && fingerprint != got.fingerprint:
		return dedup.ClaimResult{Outcome: dedup.Conflict}, nil
	case got.state == stateCompleted:
		return dedup.ClaimResult{Outcome: dedup.Duplicate, Result: got.result}, nil
	case got.state == stateInProgress:
		return dedup.ClaimResult{Outcome: dedup.InProgress}, nil
	default:
		return dedup.ClaimResult{}, fmt.Errorf("postgres: claim: record has unknown state %q", got.state)
	}
}

// CompleteBatch implements [dedup.BatchStore.CompleteBatch]: Complete's
// statement for every record, in one pgx.Batch (one round trip per
// BatchRequestSize records), one implicit transaction, in key-hash order;
// each record's answer is Complete's. A failed statement fails (and rolls
// back) its whole request. A DB without SendBatch gets one Complete per
// record.
func (s *Store) CompleteBatch(ctx context.Context, reqs []dedup.CompleteRequest) []error {
	errs := make([]error, len(reqs))
	sender, ok := s.db.(batchSender)
	if !ok {
		for i, r := range reqs {
			errs[i] = s.Complete(ctx, r.Claim, r.Result, r.Retention)
		}
		return errs
	}
	type rec struct {
		i             int
		hash          []byte
		done, already bool
	}
	var recs []*rec
	for i, r := range reqs {
		if errs[i] = storekit.CheckDuration("retention", r.Retention); errs[i] == nil {
			recs = append(recs, &rec{i: i, hash: keyHash(r.Claim.Key)})
		}
	}
	slices.SortStableFunc(recs, func(a, b *rec) int { return bytes.Compare(a.hash, b.hash) })
	status := responseStatus(ctx)
	s.sendBatch(ctx, sender, "complete", len(recs), func(b *pgx.Batch, k int) {
		r := reqs[recs[k].i]
		b.Queue(s.sql.complete, recs[k].hash, r.Claim.Token, r.Result, micros(r.Retention), status)
	}, func(br pgx.BatchResults, k int) error {
		return br.QueryRow().Scan(&recs[k].done, &recs[k].already)
	}, func(k int, err error) {
		c, key := recs[k], reqs[recs[k].i].Claim.Key
		switch {
		case err != nil:
			errs[c.i] = err
		case c.already:
			errs[c.i] = fmt.Errorf("postgres: complete %.64q: %w", key, dedup.ErrAlreadyCompleted)
		case !c.done:
			errs[c.i] = fmt.Errorf("postgres: complete %.64q: %w", key, dedup.ErrClaimLost)
		}
	})
	return errs
}

// ReleaseBatch implements [dedup.BatchStore.ReleaseBatch]: Release's
// statement for every claim, in one pgx.Batch (one round trip per
// BatchRequestSize claims), one implicit transaction, in key-hash order;
// each claim's answer is Release's. A DB without SendBatch gets one
// Release per claim.
func (s *Store) ReleaseBatch(ctx context.Context, claims []dedup.Claim) []error {
	errs := make([]error, len(claims))
	sender, ok := s.db.(batchSender)
	if !ok {
		for i, c := range claims {
			errs[i] = s.Release(ctx, c)
		}
		return errs
	}
	order := make([]int, len(claims))
	hashes := make([][]byte, len(claims))
	for i, c := range claims {
		order[i], hashes[i] = i, keyHash(c.Key)
	}
	slices.SortStableFunc(order, func(a, b int) int { return bytes.Compare(hashes[a], hashes[b]) })
	affected := make([]int64, len(claims))
	s.sendBatch(ctx, sender, "release", len(order), func(b *pgx.Batch, k int) {
		b.Queue(s.sql.release, hashes[order[k]], claims[order[k]].Token)
	}, func(br pgx.BatchResults, k int) error {
		tag, err := br.Exec()
		affected[order[k]] = tag.RowsAffected()
		return err
	}, func(k int, err error) {
		i := order[k]
		switch {
		case err != nil:
			errs[i] = err
		case affected[i] == 0:
			errs[i] = fmt.Errorf("postgres: release %.64q: %w", claims[i].Key, dedup.ErrClaimLost)
		}
	})
	return errs
}

// sendBatch sends n statements (queue queues the k-th) in pgx batches of at
// most BatchRequestSize, one round trip each, reads each statement's
// answer (read), and reports each to decide: the statement's own error
// (pgx.ErrNoRows included), or, when any statement of its batch failed or
// the batch did not commit, the batch's error for every statement of it
// (the implicit transaction wrote nothing).
func (s *Store) sendBatch(ctx context.Context, sender batchSender, op string, n int,
	queue func(b *pgx.Batch, k int), read func(br pgx.BatchResults, k int) error, decide func(k int, err error)) {
	for start := 0; start < n; start += BatchRequestSize {
		end := min(n, start+BatchRequestSize)
		b := &pgx.Batch{}
		for k := start; k < end; k++ {
			queue(b, k)
		}
		br := sender.SendBatch(ctx, b)
		stmtErrs := make([]error, end-start)
		var failed error
		for k := start; k < end; k++ {
			err := read(br, k)
			stmtErrs[k-start] = err
			if err != nil && !errors.Is(err, pgx.ErrNoRows) && failed == nil {
				failed = err
			}
		}
		if err := br.Close(); err != nil && failed == nil {
			failed = err
		}
		for k := start; k < end; k++ {
			err := stmtErrs[k-start]
			if failed != nil {
				err = fmt.Errorf("postgres: %s: %w", op, failed)
			}
			decide(k, err)
		}
	}
}
