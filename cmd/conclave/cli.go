package main

import (
	"bytes"
	"encoding/json"
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
