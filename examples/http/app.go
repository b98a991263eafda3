package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	goredis "github.com/redis/go-redis/v9"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	dedupredis "github.com/watermill-dedup/watermill-dedup/stores/redis"
)

// keyPrefix is where the example's records live in Redis.
const keyPrefix = "example:"

// eventsTopic is the GoChannel topic the webhook receiver publishes to and
// the consumer reads.
const eventsTopic = "payment-events"

// apiKeys stands for the authentication of a real API: bearer token → account.
var apiKeys = map[string]string{
	"sk_test_alice": "acct_alice",
	"sk_test_bob":   "acct_bob",
}

// app is the payments API, the webhook receiver and the Watermill consumer,
// sharing one Redis store.
type app struct {
	client goredis.UniversalClient
	store  *dedupredis.Store
	pubSub *gochannel.GoChannel
	router *message.Router
	mux    *http.ServeMux

	paymentSeq     atomic.Int64                               // ids pay_0001, pay_0002, ...
	paymentsMade   atomic.Int64                               // effects of POST /payments
	webhookEvents  atomic.Int64                               // effects of the webhook receiver
	receiptsSent   atomic.Int64                               // effects of the consumer
	demoDelay      func(ctx context.Context, d time.Duration) // X-Demo-Delay; tests replace it
	routerFinished chan struct{}
	closeOnce      sync.Once
}

type accountKey struct{}

// authenticate maps "Authorization: Bearer <key>" to an account in the
// request's context, or answers 401.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		account, ok := apiKeys[token]
		if !ok {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "unknown API key", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

// accountIdentity is the httpdedup.IdentityFunc of the API: the account the
// authentication put in the context.
func accountIdentity(r *http.Request) (string, error) {
	if account, ok := r.Context().Value(accountKey{}).(string); ok {
		return account, nil
	}
	return "", errors.New("not authenticated")
}

// newApp wires everything on client and starts the consumer. logger gets
// the middlewares' decisions.
func newApp(ctx context.Context, client goredis.UniversalClient, logger watermill.LoggerAdapter) (*app, error) {
	store, err := dedupredis.New(ctx, dedupredis.Config{Client: client, KeyPrefix: keyPrefix})
	if err != nil {
		return nil, err
	}
	a := &app{client: client, store: store, mux: http.NewServeMux(),
		routerFinished: make(chan struct{}), demoDelay: sleep}

	// The API: Idempotency-Key required, scoped by account.
	api, err := httpdedup.New(httpdedup.Config{
		Dedup:    dedup.Config{Store: store, Retention: 24 * time.Hour, Logger: logger},
		Identity: accountIdentity,
	})
	if err != nil {
		return nil, err
	}
	a.mux.Handle("POST /payments", authenticate(api.Require(http.HandlerFunc(a.createPayment))))

	// The webhook receiver: the provider's event id (JSON "id") is the key;
	// one provider calls this route, so its identity is constant. (A real
	// receiver verifies the provider's signature before this middleware.)
	hooks, err := httpdedup.New(httpdedup.Config{
		Dedup:    dedup.Config{Store: store, Logger: logger},
		Identity: httpdedup.StaticIdentity("payments-provider"),
		Key:      httpdedup.BodyKey(keyfuncs.JSON("id")),
	})
	if err != nil {
		return nil, err
	}
	a.mux.Handle("POST /webhooks/payments-provider", hooks.Require(http.HandlerFunc(a.receiveWebhook)))

	a.mux.HandleFunc("GET /stats", a.stats)
	a.mux.HandleFunc("GET /records", a.records)

	// The consumer: a Watermill router whose dedup middleware uses the same
	// store, keyed on the payment id, so that two different events about one
	// payment send one receipt.
	a.pubSub = gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	a.router, err = message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	d, err := dedup.New(dedup.Config{
		Store:  store,
		Key:    keyfuncs.JSON("data.payment_id"),
		Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	a.router.AddConsumerHandler("send-receipt", eventsTopic, a.pubSub, a.sendReceipt)
	a.router.AddMiddleware(d.Middleware)
	go func() {
		defer close(a.routerFinished)
		if err := a.router.Run(context.WithoutCancel(ctx)); err != nil {
			logger.Error("router stopped", err, nil)
		}
	}()
	select {
	case <-a.router.Running():
	case <-a.routerFinished:
		return nil, errors.New("the Watermill router stopped at start")
	}
	return a, nil
}

// Handler is the HTTP side of the app.
func (a *app) Handler() http.Handler { return a.mux }

// Close stops the consumer.
func (a *app) Close() error {
	var err error
	a.closeOnce.Do(func() {
		err = a.router.Close()
		<-a.routerFinished
		err = errors.Join(err, a.pubSub.Close())
	})
	return err
}

type paymentRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

type payment struct {
	ID       string `json:"id"`
	Account  string `json:"account"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
}

// createPayment is the effect the key protects: it "charges" and answers 201.
// X-Demo-Delay (e.g. 3s) makes it slow, to show the 409 of a concurrent
// retry.
func (a *app) createPayment(w http.ResponseWriter, r *http.Request) {
	var req paymentRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid JSON: " + err.Error()})
		return
	}
	if req.Amount <= 0 || len(req.Currency) != 3 {
		// Stored like a success: a retry with the same key gets the same 400.
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "amount must be positive and currency a 3-letter code"})
		return
	}
	if d, err := time.ParseDuration(r.Header.Get("X-Demo-Delay")); err == nil && d > 0 {
		a.demoDelay(r.Context(), min(d, 30*time.Second))
	}
	account, _ := accountIdentity(r)
	p := payment{
		ID:       fmt.Sprintf("pay_%04d", a.paymentSeq.Add(1)),
		Account:  account,
		Amount:   req.Amount,
		Currency: req.Currency,
		Status:   "succeeded",
	}
	a.paymentsMade.Add(1)
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// receiveWebhook publishes the provider's event to the consumer and answers
// once the consumer acknowledged it (BlockPublishUntilSubscriberAck). A
// failed publish is a 500: the claim is released and the provider's retry
// delivers again.
func (a *app) receiveWebhook(w http.ResponseWriter, r *http.Request) {
	var event struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Data struct {
			PaymentID string `json:"payment_id"`
		} `json:"data"`
	}
	body, err := io.ReadAll(r.Body) // the middleware already read it once; this is its copy
	if err == nil {
		err = json.Unmarshal(body, &event)
	}
	if err != nil || event.Data.PaymentID == "" {
		// The consumer could not key it: refuse it here rather than queue it.
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "expected a JSON event with data.payment_id"})
		return
	}
	a.webhookEvents.Add(1)
	msg := message.NewMessage(watermill.NewUUID(), body)
	if err := a.pubSub.Publish(eventsTopic, msg); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "could not queue the event"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"received": event.ID})
}

// sendReceipt is the consumer's effect: once per payment.
func (a *app) sendReceipt(msg *message.Message) error {
	a.receiptsSent.Add(1)
	return nil
}

func (a *app) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]int64{
		"payments_created":       a.paymentsMade.Load(),
		"webhook_events_handled": a.webhookEvents.Load(),
		"receipts_sent":          a.receiptsSent.Load(),
	})
}

// records lists the store's keys: the API's, the webhook receiver's and the
// consumer's records side by side in one Redis.
func (a *app) records(w http.ResponseWriter, r *http.Request) {
	var keys []string
	iter := a.client.Scan(r.Context(), 0, keyPrefix+"*", 100).Iterator()
	for iter.Next(r.Context()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	slices.Sort(keys)
	writeJSON(w, http.StatusOK, keys)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
