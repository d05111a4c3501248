package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

var nginxOnce struct {
	sync.Once
	bin string
	err error
}

// nginxBinary finds Debian's nginx, installing it with the project's script
// when it is missing.
func nginxBinary() (string, error) {
	nginxOnce.Do(func() {
		find := func() string {
			if p, err := exec.LookPath("nginx"); err == nil {
				return p
			}
			if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
				return "/usr/sbin/nginx"
			}
			return ""
		}
		if nginxOnce.bin = find(); nginxOnce.bin != "" {
			return
		}
		root, err := RepoRoot()
		if err != nil {
			nginxOnce.err = err
			return
		}
		if out, err := exec.Command(filepath.Join(root, "scripts", "install-test-deps.sh")).CombinedOutput(); err != nil {
			nginxOnce.err = fmt.Errorf("testenv: installing nginx: %v\n%s", err, out)
			return
		}
		if nginxOnce.bin = find(); nginxOnce.bin == "" {
			nginxOnce.err = fmt.Errorf("testenv: nginx not found after installing it")
		}
	})
	return nginxOnce.bin, nginxOnce.err
}

// NginxGRPC starts nginx on a free loopback port as a gRPC load balancer
// (grpc_pass, round robin per stream) in front of upstreams. A dead upstream
// is skipped for failTimeout (nginx syntax, e.g. "2s") after one failure, as
// a production load balancer's health checking would.
func NginxGRPC(ctx context.Context, dir string, upstreams []string, failTimeout string) (*Component, error) {
	bin, err := nginxBinary()
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	var servers strings.Builder
	for _, u := range upstreams {
		fmt.Fprintf(&servers, "    server %s max_fails=1 fail_timeout=%s;\n", u, failTimeout)
	}
	conf := fmt.Sprintf(`daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream gateways {
%[2]s  }
  server {
    listen 127.0.0.1:%[3]d http2;
    location / {
      grpc_pass grpc://gateways;
      # Agent streams live for hours; nginx must not cut them.
      grpc_read_timeout 1h;
      grpc_send_timeout 1h;
      grpc_next_upstream error timeout http_502 http_503;
    }
  }
}
`, dir, servers.String(), port)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	return Start(ctx, "nginx", port, bin, "-c", path, "-p", dir, "-e", filepath.Join(dir, "error.log"))
}
