package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/conclave-ai/conclave/pkg/config"
)

// envOr is the environment's value of key, or def when it is unset or empty.
func envOr(lookup config.Lookup, key, def string) string {
	if v, ok := lookup(key); ok && v != "" {
		return v
	}
	return def
}

// printJSON prints a service's JSON answer indented, or as it came when it
// is not JSON.
func printJSON(w io.Writer, answer []byte) error {
	var out bytes.Buffer
	if json.Indent(&out, answer, "", "  ") != nil {
		out.Reset()
		out.Write(answer)
	}
	out.WriteByte('\n')
	_, err := w.Write(out.Bytes())
	return err
}

// parseInterleaved parses flags wherever they stand among the arguments, as
// people type them ("send hello --agent a1"), and returns the other
// arguments in order. Everything after "--" is an argument.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		left := fs.Args()
		if len(left) == 0 {
			return rest, nil
		}
		if used := len(args) - len(left); used > 0 && args[used-1] == "--" {
			return append(rest, left...), nil
		}
		rest, args = append(rest, left[0]), left[1:]
	}
}

// argCount is a command's check of its positional arguments: need(n, what)
// fails, naming the command and what it expected, unless there are n.
func argCount(command string, positional []string) func(n int, what string) error {
	return func(n int, what string) error {
		if len(positional) != n {
			return fmt.Errorf("%s: expected %s", command, what)
		}
		return nil
	}
}
