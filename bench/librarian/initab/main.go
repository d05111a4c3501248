// Command initab times Lambda cold starts side by side: it starts each
// binary it is given in turn, n times over, under a minimal Runtime API on
// loopback, and times exec to the first GET of /invocation/next; then it
// kills the process. It prints the minimum, p25 and p50 of each, their
// ratio to the first binary's (the floor, e.g. the hello world), and the
// process's CPU time (user + system, from its rusage), which a loaded
// machine skews less than the wall clock. It is how bench/README.md's
// Librarian init figures compare two builds of the bootstrap, which
// BenchmarkInit cannot (it builds the working tree's):
//
//	go run ./librarian/initab -n 150 /tmp/hello /tmp/bootstrap-before /tmp/bootstrap-after
//
// A binary may be given as path@NAME=value to add one environment
// variable to its starts.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	n := flag.Int("n", 40, "starts of each binary")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: initab [-n N] floor-binary binary...")
		os.Exit(2)
	}
	if err := run(*n, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "initab:", err)
		os.Exit(1)
	}
}

// env is BenchmarkInit's: the AWS backend with static credentials and no
// telemetry endpoint. Init makes no network call, so the endpoint is never
// dialed.
var env = []string{"CONCLAVE_BACKEND=aws", "CONCLAVE_AWS_ENDPOINT=http://127.0.0.1:1", "AWS_ACCESS_KEY_ID=test",
	"AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1", "CONCLAVE_LOG_LEVEL=warn", "OTEL_EXPORTER_OTLP_ENDPOINT="}

func run(n int, bins []string) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	polled, initErr := make(chan struct{}, 1), make(chan struct{}, 1)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/invocation/next"):
			select {
			case polled <- struct{}{}:
			default:
			}
			<-r.Context().Done() // no event: the process is killed
		case strings.HasSuffix(r.URL.Path, "/init/error"):
			select {
			case initErr <- struct{}{}:
			default:
			}
		}
	})}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()

	wall := make([][]time.Duration, len(bins))
	cpu := make([][]time.Duration, len(bins))
	for range n {
		for j, b := range bins {
			path, extra, _ := strings.Cut(b, "@")
			cmd := exec.Command(path)
			cmd.Env = append(os.Environ(), append(env, "AWS_LAMBDA_RUNTIME_API="+l.Addr().String())...)
			if extra != "" {
				cmd.Env = append(cmd.Env, extra)
			}
			start := time.Now()
			if err := cmd.Start(); err != nil {
				return err
			}
			var failed error
			select {
			case <-polled:
				wall[j] = append(wall[j], time.Since(start))
			case <-initErr:
				failed = fmt.Errorf("%s reported an init error", path)
			case <-time.After(10 * time.Second):
				failed = fmt.Errorf("%s did not ask for an event within 10 s", path)
			}
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if failed != nil {
				return failed
			}
			ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			cpu[j] = append(cpu[j], time.Duration(ru.Utime.Nano()+ru.Stime.Nano()))
		}
	}
	for j, b := range bins {
		path, _, _ := strings.Cut(b, "@")
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		fmt.Printf("%-24s min %5.1f p25 %5.1f p50 %5.1f ms, ratio p50 %.2f p25 %.2f min %.2f; cpu p50 %5.1f ms, ratio %.2f; %5.2f MiB\n", b,
			ms(wall[j], 0), ms(wall[j], 0.25), ms(wall[j], 0.5), ms(wall[j], 0.5)/ms(wall[0], 0.5), ms(wall[j], 0.25)/ms(wall[0], 0.25),
			ms(wall[j], 0)/ms(wall[0], 0), ms(cpu[j], 0.5), ms(cpu[j], 0.5)/ms(cpu[0], 0.5), float64(fi.Size())/(1<<20))
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load average %s", load)
	return nil
}

// ms is the q-quantile of d, in milliseconds.
func ms(d []time.Duration, q float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(q*float64(len(s)-1))].Microseconds()) / 1000
}
