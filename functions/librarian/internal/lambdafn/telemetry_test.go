package lambdafn

import "testing"

func TestOTLPHTTPBase(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		raw      string
		insecure bool
		want     string
		err      bool
	}{
		{raw: "http://localhost:4318", want: "http://localhost:4318"},
		{raw: "https://collector.example:4318/", want: "https://collector.example:4318"},
		{raw: "http://gateway.example/otlp", want: "http://gateway.example/otlp"},
		{raw: "localhost:4318", insecure: true, want: "http://localhost:4318"},
		{raw: "collector.example:4318", want: "https://collector.example:4318"},
		{raw: "grpc://localhost:4317", err: true},
		{raw: "http://", err: true},
	} {
		got, err := otlpHTTPBase(tt.raw, tt.insecure)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("otlpHTTPBase(%q, %v) = %q, %v; want %q, error %v", tt.raw, tt.insecure, got, err, tt.want, tt.err)
		}
	}
}
