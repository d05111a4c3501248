// Command kubeprobe is what testenv's KubeNode tests run in pods: a static
// binary with no shell around it.
//
//	kubeprobe copy SRC DST      copy a file, keeping it executable
//	kubeprobe env NAME          print NAME=value of the environment
//	kubeprobe dial ADDR LINE    connect to ADDR over TCP and send LINE
package main

import (
	"fmt"
	"io"
	"net"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kubeprobe:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: kubeprobe copy SRC DST | env NAME | dial ADDR LINE")
	}
	switch cmd, args := args[0], args[1:]; {
	case cmd == "copy" && len(args) == 2:
		return copyFile(args[0], args[1])
	case cmd == "env" && len(args) == 1:
		fmt.Printf("%s=%s\n", args[0], os.Getenv(args[0]))
		return nil
	case cmd == "dial" && len(args) == 2:
		conn, err := net.Dial("tcp", args[0])
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := fmt.Fprintln(conn, args[1]); err != nil {
			return err
		}
		fmt.Printf("sent %q to %s\n", args[1], args[0])
		return nil
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
