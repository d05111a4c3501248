// Command kubeprobe is what testenv's KubeNode tests run in pods: a static
// binary with no shell around it.
//
//	kubeprobe copy SRC DST      copy a file, keeping it executable
//	kubeprobe env NAME          print NAME=value of the environment
//	kubeprobe dial ADDR LINE    connect to ADDR over TCP (retrying for a
//	                            minute) and send LINE
//	kubeprobe relay LISTEN TO   serve on LISTEN: send each connection's first
//	                            line on to TO
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kubeprobe:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: kubeprobe copy SRC DST | env NAME | dial ADDR LINE | relay LISTEN TO")
	}
	switch cmd, args := args[0], args[1:]; {
	case cmd == "copy" && len(args) == 2:
		return copyFile(args[0], args[1])
	case cmd == "env" && len(args) == 1:
		fmt.Printf("%s=%s\n", args[0], os.Getenv(args[0]))
		return nil
	case cmd == "dial" && len(args) == 2:
		return dial(args[0], args[1])
	case cmd == "relay" && len(args) == 2:
		return relay(args[0], args[1])
	default:
		return fmt.Errorf("bad arguments %q", append([]string{cmd}, args...))
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// dial sends line to addr. A Service's address may take kube-proxy a moment
// to route, so a failed connection is retried for a minute.
func dial(addr, line string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			if time.Now().After(deadline) {
				return err
			}
			fmt.Println("dial:", err)
			time.Sleep(250 * time.Millisecond)
			continue
		}
		defer conn.Close()
		if _, err := fmt.Fprintln(conn, line); err != nil {
			return err
		}
		fmt.Printf("sent %q to %s\n", line, addr)
		return nil
	}
}

// relay serves on listen until killed: it reads the first line of each
// connection and sends it on to to.
func relay(listen, to string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	fmt.Println("relaying", listen, "to", to)
	for {
		conn, err := l.Accept()
		if err != nil {
			return err
		}
		line, err := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if err != nil {
			// A readiness probe's connection carries no line.
			continue
		}
		if err := dial(to, line[:len(line)-1]); err != nil {
			fmt.Println("relay:", err)
		}
	}
}
