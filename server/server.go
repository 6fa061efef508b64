// Package server serves a weft model over HTTP with OpenAI's API:
//
//	POST /v1/chat/completions  chat through the model's template, whole or streamed
//	POST /v1/completions       text completion of a prompt (or several, one after another)
//	POST /v1/embeddings        mean-pooled final hidden states, unit length; float or base64
//	GET  /v1/models[/{id}]     the one model
//	GET  /health               200, or 503 while shutting down
//	GET  /metrics              Prometheus text format
//
// Requests run concurrently up to the model's parallelism and are decoded
// together, one token each per step, by the model's scheduler (continuous
// batching); more wait in a bounded queue and the rest get 429.
//
// Streams are server-sent events as OpenAI writes them: "data: {json}"
// and a blank line per chunk; a chat stream opens with the assistant's
// role and closes with an empty delta carrying finish_reason, a
// completion stream's last chunk carries finish_reason; with
// stream_options.include_usage every chunk has "usage": null and a last
// chunk with no choices carries the usage; then "data: [DONE]".
//
// Where OpenAI leaves room, this server chooses: temperature defaults to
// 1 and a completion's max_tokens to 16, as OpenAI's do; seed 0 is a
// fixed seed like any other; top_p 0 means the most probable token; text
// content parts are joined with newlines, and role "developer" reads as
// "system". It refuses, with a 400 naming the field, what it cannot do
// faithfully: n or best_of above 1, echo, suffix, a tool_choice that
// forces a call, non-text content parts, and a json_schema it cannot follow (constrain.CompileSchema says
// which keywords it takes). response_format json_object constrains
// sampling so the reply is one JSON object, json_schema so that it follows
// the schema. Tools are rendered by the model's chat template and calls in
// the reply come back as tool_calls (tools.go). The model named in a
// request is not checked: the server has one.
package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/weftlm/weft"
)

// Options configure a Server. The zero value is usable.
type Options struct {
	// ModelID is the model's name in /v1/models and in responses
	// (default: the model file's base name). Requests may name any
	// model: the server has one.
	ModelID string
	// APIKey, when set, is required on /v1/ routes as
	// "Authorization: Bearer KEY". /health and /metrics stay open.
	APIKey string
	// MaxQueue is how many requests may wait for a slot when all are
	// busy; one more gets 429. 0: none wait.
	MaxQueue int
	// MaxBody is the largest request body in bytes (default 4 MiB);
	// larger gets 413.
	MaxBody int64
	// DrainTimeout bounds how long Serve lets running requests finish
	// once asked to stop (default 30 s); then it cuts them off.
	DrainTimeout time.Duration
	// Logger receives one line per request (default slog.Default()).
	Logger *slog.Logger
}

// Server answers OpenAI API requests with one model. It is an
// http.Handler; Serve runs it on a listener with graceful shutdown.
type Server struct {
	m       *weft.Model
	opts    Options
	info    weft.Info
	gate    *gate
	metrics *metrics
	routes  []route
	created int64 // Unix time the server started, as /v1/models reports

	handlers sync.WaitGroup // requests inside ServeHTTP

	// now and newID are the clock and the id source; tests fix them to
	// compare responses byte for byte.
	now   func() time.Time
	newID func(prefix string) string
	// pace, when set, runs before each token is handed on: tests hold a
	// generation there to catch it in flight.
	pace func(ctx context.Context)
}

// handler serves one route. It returns an error instead of writing one,
// unless the response has already begun.
type handler func(w http.ResponseWriter, r *http.Request, rec *record) error

type route struct {
	path    string // exact, or a prefix when it ends in "/"
	methods []string
	h       handler
}

// record is what a request reports for its log line and the metrics.
type record struct {
	promptTokens, completionTokens int
	cachedTokens                   int           // of the prompt, found in the slot's cache
	firstToken                     time.Duration // from arrival; 0 when none came
}

// New returns a server for m, which must stay open while the server runs.
func New(m *weft.Model, o Options) *Server {
	if o.MaxBody <= 0 {
		o.MaxBody = 4 << 20
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	info := m.Info()
	if o.ModelID == "" {
		o.ModelID = strings.TrimSuffix(filepath.Base(info.Path), ".gguf")
	}
	s := &Server{m: m, opts: o, info: info, gate: newGate(max(info.Parallel, 1), max(o.MaxQueue, 0)),
		metrics: newMetrics(), now: time.Now, newID: randomID}
	s.created = s.now().Unix()
	s.routes = []route{
		{"/v1/chat/completions", []string{http.MethodPost}, s.chat},
		{"/v1/completions", []string{http.MethodPost}, s.completions},
		{"/v1/embeddings", []string{http.MethodPost}, s.embeddings},
		{"/v1/models", []string{http.MethodGet}, s.models},
		{"/v1/models/", []string{http.MethodGet}, s.model},
		{"/health", []string{http.MethodGet}, s.health},
		{"/metrics", []string{http.MethodGet}, s.writeMetrics},
	}
	return s
}

func randomID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// ServeHTTP routes the request, checks the key, runs the handler, and
// logs and counts the outcome.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handlers.Add(1)
	defer s.handlers.Done()
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w}
	rec := &record{}
	name, h, err := s.route(rw, r)
	if err == nil && strings.HasPrefix(r.URL.Path, "/v1/") && !s.authorized(r) {
		err = errUnauthorized
	}
	if err == nil {
		r.Body = http.MaxBytesReader(rw, r.Body, s.opts.MaxBody)
		err = h(rw, r, rec)
	}
	if err != nil {
		ae := toAPIError(err)
		if !rw.started() {
			writeJSON(rw, ae.Status, ae.body())
		} else if rw.status == 0 {
			rw.status = ae.Status
		}
	}
	d := time.Since(start)
	s.metrics.observe(name, rw.code(), d, rec)
	attrs := []any{"method", r.Method, "path", r.URL.Path, "status", rw.code(), "duration", d.Round(time.Microsecond),
		"prompt_tokens", rec.promptTokens, "completion_tokens", rec.completionTokens}
	if rec.cachedTokens > 0 {
		attrs = append(attrs, "cached_tokens", rec.cachedTokens)
	}
	if err != nil {
		attrs = append(attrs, "error", err.Error())
	}
	s.opts.Logger.Info("request", attrs...)
}

// route finds the handler; name is the route for metrics ("other" when
// none matches). A wrong method gets 405 with the Allow header.
func (s *Server) route(w http.ResponseWriter, r *http.Request) (name string, h handler, err error) {
	for _, rt := range s.routes {
		if rt.path != r.URL.Path && !(strings.HasSuffix(rt.path, "/") && strings.HasPrefix(r.URL.Path, rt.path)) {
			continue
		}
		method := r.Method
		if method == http.MethodHead {
			method = http.MethodGet // net/http drops the body
		}
		for _, m := range rt.methods {
			if m == method {
				return rt.path, rt.h, nil
			}
		}
		w.Header().Set("Allow", strings.Join(rt.methods, ", "))
		return rt.path, nil, &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
			Message: r.Method + " is not allowed on " + r.URL.Path + "; use " + strings.Join(rt.methods, ", ")}
	}
	return "other", nil, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
		Message: "no route " + r.Method + " " + r.URL.Path + "; this server has /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /health and /metrics"}
}

// authorized compares the bearer token in constant time.
func (s *Server) authorized(r *http.Request) bool {
	if s.opts.APIKey == "" {
		return true
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(key)), []byte(s.opts.APIKey)) == 1
}

// Serve answers requests on ln until ctx ends, then shuts down: it stops
// accepting, refuses queued requests with 503, lets running ones finish
// for up to DrainTimeout, then cuts off the rest and waits for their
// handlers to return. It returns nil after a clean drain.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(s.opts.Logger.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	active, waiting := s.gate.depth()
	s.opts.Logger.Info("shutting down", "running", active, "queued", waiting, "drain_timeout", s.opts.DrainTimeout)
	s.gate.close()
	dctx, cancel := context.WithTimeout(context.Background(), s.opts.DrainTimeout)
	defer cancel()
	err := hs.Shutdown(dctx)
	if err != nil {
		// Closing the connections cancels the requests' contexts, which
		// ends their generations at the next step.
		s.opts.Logger.Warn("drain timed out; cutting off running requests", "error", err)
		hs.Close()
	}
	s.handlers.Wait()
	if srvErr := <-served; !errors.Is(srvErr, http.ErrServerClosed) {
		return srvErr
	}
	return err
}

// statusWriter remembers the status written, for the log and metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection to flush.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) started() bool { return w.status != 0 }

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// writeJSON writes v as the whole response. HTML characters are left
// unescaped, as OpenAI's servers send them.
func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(append(b, '\n'))
	return err
}

func marshal(v any) ([]byte, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return []byte(strings.TrimSuffix(b.String(), "\n")), nil
}
