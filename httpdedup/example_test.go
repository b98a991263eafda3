package httpdedup_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/watermill-dedup/watermill-dedup/dedup"
	"github.com/watermill-dedup/watermill-dedup/httpdedup"
	"github.com/watermill-dedup/watermill-dedup/keyfuncs"
	"github.com/watermill-dedup/watermill-dedup/stores/memory"
)

func ExampleMiddleware_Require() {
	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		panic(err)
	}
	idem, err := httpdedup.New(httpdedup.Config{
		Dedup: dedup.Config{Store: store}, // a shared store (stores/redis, ...) in production
		Identity: func(r *http.Request) (string, error) {
			// Whatever the authentication middleware established.
			if acct := r.Header.Get("X-Account"); acct != "" {
				return acct, nil
			}
			return "", errors.New("not authenticated")
		},
	})
	if err != nil {
		panic(err)
	}
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/pay_1")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintln(w, `{"id":"pay_1","amount":4200}`)
	})))

	post := func(key, body string) {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		r.Header.Set("X-Account", "acct_42")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Printf("%d replayed=%q %s", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	post(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `{"amount":4200}`)
	post(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, `{"amount":4200}`) // the client's retry
	post(`8e03978e-40d5-43e8-bc93-6894a57f9324`, `{"amount":9900}`)   // same key, other request
	post(``, `{"amount":4200}`)
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" {"id":"pay_1","amount":4200}
	// 201 replayed="true" {"id":"pay_1","amount":4200}
	// 422 replayed="" {"type":"https://github.com/watermill-dedup/watermill-dedup/blob/main/httpdedup/README.md#key-reused","title":"Idempotency key reused","status":422,"detail":"This idempotency key was used with a different request; use a new key for a new request."}
	// 400 replayed="" {"type":"https://github.com/watermill-dedup/watermill-dedup/blob/main/httpdedup/README.md#key-missing","title":"Idempotency key missing","status":400,"detail":"This operation requires an idempotency key: no Idempotency-Key header."}
	// charges: 1
}

func ExampleBodyKey() {
	// A webhook receiver keyed on the provider's event id, in the JSON body.
	// One provider calls the route, so the identity is constant.
	store, err := memory.New(context.Background(), memory.Config{})
	if err != nil {
		panic(err)
	}
	idem, err := httpdedup.New(httpdedup.Config{
		Dedup:    dedup.Config{Store: store},
		Identity: httpdedup.StaticIdentity("provider"),
		Key:      httpdedup.BodyKey(keyfuncs.JSON("id")),
	})
	if err != nil {
		panic(err)
	}
	handled := 0
	hook := idem.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled++
		w.WriteHeader(http.StatusNoContent)
	}))
	for i := 0; i < 3; i++ { // the provider delivers the event three times
		w := httptest.NewRecorder()
		hook.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/webhooks", strings.NewReader(`{"id":"evt_1","type":"payment.succeeded"}`)))
		fmt.Printf("%d replayed=%q\n", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("handled:", handled)
	// Output:
	// 204 replayed=""
	// 204 replayed="true"
	// 204 replayed="true"
	// handled: 1
}
