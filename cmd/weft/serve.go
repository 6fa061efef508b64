package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/weftlm/weft"
	"github.com/weftlm/weft/placement"
	"github.com/weftlm/weft/server"
)

func init() {
	register(command{name: "serve", summary: "serve a model over HTTP with OpenAI's API (chat, completions, embeddings)", run: runServe})
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", stderr)
	model := fs.String("m", "", "model: a file, a directory, or a name from the Hugging Face cache or ollama store")
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on (port 0 picks a free one)")
	parallel := fs.Int("parallel", 4, "requests decoded at once, each with its own KV cache")
	ctxLen := fs.Int("ctx", 0, "context length per request (0: the model's, capped at 4096)")
	threads := fs.Int("threads", 0, "CPU threads (0: one per CPU)")
	apiKey := fs.String("api-key", os.Getenv("WEFT_API_KEY"), "require \"Authorization: Bearer KEY\" on /v1/ routes (default $WEFT_API_KEY; empty: open)")
	maxQueue := fs.Int("max-queue", 64, "requests that may wait for a slot; more get 429")
	maxBody := fs.Int64("max-body", 4<<20, "largest request body in bytes; larger gets 413")
	drain := fs.Duration("drain", 30*time.Second, "on SIGINT or SIGTERM, how long running requests may finish")
	name := fs.String("name", "", "model id in /v1/models and responses (default: the model file's base name)")
	logFormat := fs.String("log", "text", "log format on stderr: text or json")
	backendName := fs.String("backend", "auto", backendUsage)
	gpuLayers := fs.Int("n-gpu-layers", -1, gpuLayersUsage)
	tensorSplit := fs.String("tensor-split", "", tensorSplitUsage)
	cacheType := fs.String("cache-type", "f32", cacheTypeUsage)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 0:
		return fmt.Errorf("%w: unexpected argument %q (give the model with -m)", errUsage, pos[0])
	case *model == "":
		return fmt.Errorf("%w: -m MODEL is required", errUsage)
	case *parallel < 1:
		return fmt.Errorf("%w: --parallel must be at least 1", errUsage)
	case *maxQueue < 0:
		return fmt.Errorf("%w: --max-queue must not be negative", errUsage)
	case *maxBody < 1:
		return fmt.Errorf("%w: --max-body must be positive", errUsage)
	case *drain <= 0:
		return fmt.Errorf("%w: --drain must be positive", errUsage)
	}
	shares, err := placement.ParseSplit(*tensorSplit)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	var logger *slog.Logger
	switch *logFormat {
	case "text":
		logger = slog.New(slog.NewTextHandler(stderr, nil))
	case "json":
		logger = slog.New(slog.NewJSONHandler(stderr, nil))
	default:
		return fmt.Errorf("%w: --log must be text or json", errUsage)
	}

	// A replay is never narrower than the parallelism: the scheduler
	// decodes every running request in one.
	opts := []weft.Option{weft.WithContext(*ctxLen), weft.WithThreads(*threads), weft.WithParallel(*parallel),
		weft.WithBackend(*backendName), weft.WithGPULayers(*gpuLayers), weft.WithTensorSplit(shares), weft.WithCacheType(*cacheType)}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		opts = append(opts, weft.WithProgress(progressBar(stderr)))
	}
	m, err := weft.Load(ctx, *model, opts...)
	if err != nil {
		return err
	}
	defer m.Close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := server.New(m, server.Options{ModelID: *name, APIKey: *apiKey, MaxQueue: *maxQueue, MaxBody: *maxBody,
		DrainTimeout: *drain, Logger: logger})
	in := m.Info()
	logger.Info("listening", "url", "http://"+ln.Addr().String(), "model", in.Path, "architecture", in.Architecture,
		"slots", in.Parallel, "context", in.Context, "threads", in.Threads, "chat_template", in.ChatTemplate, "api_key", *apiKey != "",
		"backend", in.Backend, "placement", in.Placement)
	if in.CPUFallback != "" {
		logger.Warn("running on the CPU", "reason", in.CPUFallback)
	}

	// The signals are caught here as well as in main, so that the command
	// drains the same way when a test runs it directly.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.Serve(ctx, ln); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	logger.Info("stopped")
	return nil
}
