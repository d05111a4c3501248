package telemetry

import "testing"

func TestParseEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw      string
		insecure bool
		want     otlpTarget
		wantErr  bool
	}{
		{raw: "otel-collector:4317", want: otlpTarget{endpoint: "otel-collector:4317"}},
		{raw: "127.0.0.1:4317", insecure: true, want: otlpTarget{endpoint: "127.0.0.1:4317", insecure: true}},
		{raw: "http://otel-collector:4317", want: otlpTarget{endpoint: "otel-collector:4317", insecure: true}},
		{raw: "https://otel.example.com:4317", want: otlpTarget{endpoint: "otel.example.com:4317"}},
		{raw: "https://otel.example.com:4317", insecure: true, want: otlpTarget{endpoint: "otel.example.com:4317", insecure: true}},
		{raw: "ftp://otel:4317", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			t.Parallel()
			got, err := parseEndpoint(tt.raw, tt.insecure)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseEndpoint(%q) error = %v, wantErr %v", tt.raw, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("parseEndpoint(%q, %v) = %+v, want %+v", tt.raw, tt.insecure, got, tt.want)
			}
		})
	}
}
