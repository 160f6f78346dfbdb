package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// serveOptions are serve's own flags.
type serveOptions struct {
	addr    string
	actions bool
	config  string
}

// defaultServeAddr is where serve listens unless told otherwise: loopback
// only, since the dashboard shows every tenant's keys.
const defaultServeAddr = "127.0.0.1:8080"

// tokenEnv names the environment variable that gives the actions token.
const tokenEnv = "THROTTLECTL_TOKEN"

// Timeouts of the dashboard's HTTP server.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	shutdownTimeout   = 10 * time.Second
)

// runServe serves the web dashboard until SIGINT or SIGTERM.
func runServe(a *app, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return a.serve(ctx, args)
}

// serve parses serve's command line, then serves the dashboard until ctx
// is done, and shuts it down gracefully.
func (a *app) serve(ctx context.Context, args []string) error {
	fs := a.commandFlags()
	var opts serveOptions
	fs.StringVar(&opts.addr, "addr", defaultServeAddr, "`host:port` to listen on; loopback by default, as the dashboard shows every key (\":8080\" listens on every interface)")
	fs.BoolVar(&opts.actions, "actions", false, "enable the dashboard's actions (reset, block, unblock, set, unset), guarded by a token: $"+tokenEnv+" when set (16 characters or more), else a random one printed on stderr")
	fs.StringVar(&opts.config, "config", "", "JSON `file` mapping named limiters to their policies in code, for those with none stored and no process publishing counts")
	operands, err := a.parseCommand(fs, args)
	if err != nil {
		return err
	}
	if len(operands) > 0 {
		return usagef("serve: takes no arguments, got %q", operands)
	}
	if err := checkListenAddr(opts.addr); err != nil {
		return err
	}
	dashOpts := []dashboard.Option{
		dashboard.WithPrefix(a.prefix),
		dashboard.WithTimeout(a.timeout),
		dashboard.WithLogger(slog.New(slog.NewTextHandler(a.stderr, nil))),
	}
	if opts.config != "" {
		policies, err := codePolicies(opts.config)
		if err != nil {
			return err
		}
		dashOpts = append(dashOpts, dashboard.WithCodePolicies(policies))
	}
	token, generated := "", false
	if opts.actions {
		if token, generated, err = actionsToken(); err != nil {
			return err
		}
		dashOpts = append(dashOpts, dashboard.WithActions(token))
	}
	client, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer client.Close()
	h, err := dashboard.New(client, dashOpts...)
	if err != nil {
		return usagef("serve: %v", err)
	}
	ln, err := net.Listen("tcp", opts.addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       idleTimeout,
		ErrorLog:          log.New(a.stderr, "throttlectl: ", 0),
	}
	if generated {
		fmt.Fprintf(a.stderr, "throttlectl: actions token (type it into the page when asked): %s\n", token)
	}
	fmt.Fprintf(a.stdout, "dashboard: http://%s/\n", ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("serve: shutting down: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// checkListenAddr reports a --addr that is not host:port with a port
// number or service name.
func checkListenAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("--addr %q: want host:port, e.g. %s: %v", addr, defaultServeAddr, err)
	}
	if _, err := net.LookupPort("tcp", port); err != nil || port == "" {
		return usagef("--addr %q: bad port %q", addr, port)
	}
	return nil
}

// actionsToken returns the token that guards the dashboard's actions:
// $THROTTLECTL_TOKEN when set, else a random one (generated true).
func actionsToken() (token string, generated bool, err error) {
	if token = os.Getenv(tokenEnv); token != "" {
		if len(token) < 16 {
			return "", false, usagef("$%s: the actions token must be at least 16 characters, got %d", tokenEnv, len(token))
		}
		return token, false, nil
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", false, fmt.Errorf("serve: generating the actions token: %w", err)
	}
	return hex.EncodeToString(b[:]), true, nil
}

// codePolicies reads a --config file into the policies in code of named
// limiters. Concurrency caps, which have no name in their keys, are
// passed over: the file may be the one peek and top take.
func codePolicies(path string) (map[string]throttle.Policy, error) {
	named, err := readConfig(path)
	if err != nil {
		return nil, err
	}
	policies := map[string]throttle.Policy{}
	for name, s := range named {
		if strings.HasPrefix(s, "conc:") {
			continue
		}
		p, err := parseRatePolicy(s)
		if err != nil {
			return nil, usagef("--config %s, limiter %q: %v", path, name, err)
		}
		policies[name] = p
	}
	return policies, nil
}
