package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jobthrottle/jobthrottle/dashboard"
	"github.com/redis/go-redis/v9"
)

// demoDashboard is the web dashboard --dashboard serves while the fleet
// runs, and the Publisher that feeds it the fleet's counts.
type demoDashboard struct {
	pub    *dashboard.Publisher
	srv    *http.Server
	url    string // http://host:port/, the port the listener got
	token  string // guards the dashboard's actions
	served chan error
}

// startDashboard listens on addr and serves the dashboard over the keys
// under prefix, with its actions enabled by a random token. Its Publisher
// is to be given to every limiter and Throttler of the fleet.
func startDashboard(rdb redis.UniversalClient, addr, prefix string) (*demoDashboard, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	dd := &demoDashboard{token: hex.EncodeToString(b[:]), served: make(chan error, 1)}
	pub, err := dashboard.NewPublisher(rdb, dashboard.WithPublishPrefix(prefix))
	if err != nil {
		return nil, err
	}
	dd.pub = pub
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // the demo's view owns the terminal
	h, err := dashboard.New(rdb, dashboard.WithPrefix(prefix), dashboard.WithActions(dd.token), dashboard.WithLogger(quiet))
	if err != nil {
		dd.close()
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		dd.close()
		return nil, fmt.Errorf("--dashboard: %w", err)
	}
	dd.url = "http://" + ln.Addr().String() + "/"
	dd.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { dd.served <- dd.srv.Serve(ln) }()
	return dd, nil
}

// close stops serving the dashboard and flushes and closes the Publisher.
func (dd *demoDashboard) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var errs []error
	if dd.srv != nil {
		errs = append(errs, dd.srv.Shutdown(ctx))
		if err := <-dd.served; !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, err)
		}
	}
	if dd.pub != nil {
		errs = append(errs, dd.pub.Close(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing the dashboard: %w", err)
	}
	return nil
}

// introduce prints where the dashboard serves and its actions token, each
// line within defaultWidth.
func (dd *demoDashboard) introduce(out io.Writer) {
	printWrapped(out, "Dashboard, while the fleet runs: "+dd.url)
	fmt.Fprintf(out, "  actions token: %s\n", dd.token)
}
