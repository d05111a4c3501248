package auth_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/conclave-ai/conclave/pkg/auth"
	"github.com/conclave-ai/conclave/pkg/config"
)

func TestParseThrottleSetting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want auth.ThrottleSetting
		err  string // part of the error; "" when the value is good
	}{
		{"20/1s", auth.ThrottleSetting{Burst: auth.ThrottleBurst, Every: auth.ThrottleEvery}, ""},
		{"5/1h", auth.ThrottleSetting{Burst: 5, Every: time.Hour}, ""},
		{" 1 / 250ms ", auth.ThrottleSetting{Burst: 1, Every: 250 * time.Millisecond}, ""},
		{"100/1m30s", auth.ThrottleSetting{Burst: 100, Every: 90 * time.Second}, ""},
		{"", auth.ThrottleSetting{}, "is not BURST/EVERY"},
		{"20", auth.ThrottleSetting{}, "is not BURST/EVERY"},
		{"20/", auth.ThrottleSetting{}, "not a positive duration"},
		{"/1s", auth.ThrottleSetting{}, "not a whole number of at least 1"},
		{"0/1s", auth.ThrottleSetting{}, "not a whole number of at least 1"},
		{"-3/1s", auth.ThrottleSetting{}, "not a whole number of at least 1"},
		{"2.5/1s", auth.ThrottleSetting{}, "not a whole number of at least 1"},
		{"20/0s", auth.ThrottleSetting{}, "not a positive duration"},
		{"20/-1s", auth.ThrottleSetting{}, "not a positive duration"},
		{"20/1", auth.ThrottleSetting{}, "not a positive duration"},
		{"20/second", auth.ThrottleSetting{}, "not a positive duration"},
		{"20/1s/1s", auth.ThrottleSetting{}, "not a positive duration"},
		{"99999999999999999999/1s", auth.ThrottleSetting{}, "not a whole number of at least 1"},
	}
	for _, tt := range tests {
		got, err := auth.ParseThrottleSetting(tt.in)
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("%q: %v", tt.in, err)
		case tt.err == "" && got != tt.want:
			t.Errorf("%q = %+v, want %+v", tt.in, got, tt.want)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("%q: error %v, want one saying %q", tt.in, err, tt.err)
		}
	}
}

// TestThrottleSettingAsSetting loads the setting the way every service
// does: its default, a value from the environment, a bad value (refused
// naming the key), and -h.
func TestThrottleSettingAsSetting(t *testing.T) {
	t.Parallel()
	type cfg struct {
		Throttle auth.ThrottleSetting `env:"CONCLAVE_X_AUTH_THROTTLE" default:"20/1s" help:"wrong tokens"`
	}
	load := func(env map[string]string, args ...string) (cfg, string, error) {
		var c cfg
		var usage strings.Builder
		err := config.Load(context.Background(), &c, "x", args, func(k string) (string, bool) {
			v, ok := env[k]
			return v, ok
		}, &usage)
		return c, usage.String(), err
	}
	if c, _, err := load(nil); err != nil || c.Throttle != (auth.ThrottleSetting{Burst: 20, Every: time.Second}) {
		t.Errorf("default: %+v, %v", c.Throttle, err)
	}
	if c, _, err := load(map[string]string{"CONCLAVE_X_AUTH_THROTTLE": "3/1h"}); err != nil || c.Throttle != (auth.ThrottleSetting{Burst: 3, Every: time.Hour}) {
		t.Errorf("from the environment: %+v, %v", c.Throttle, err)
	}
	if c, _, err := load(nil, "--x-auth-throttle=7/2m"); err != nil || c.Throttle != (auth.ThrottleSetting{Burst: 7, Every: 2 * time.Minute}) {
		t.Errorf("from a flag: %+v, %v", c.Throttle, err)
	}
	if _, _, err := load(map[string]string{"CONCLAVE_X_AUTH_THROTTLE": "0/1s"}); err == nil || !strings.Contains(err.Error(), "CONCLAVE_X_AUTH_THROTTLE") {
		t.Errorf("a burst of 0: %v, want an error naming the setting", err)
	}
	_, usage, err := load(nil, "-h")
	if !errors.Is(err, config.ErrHelp) || !strings.Contains(usage, "--x-auth-throttle burst/every") || !strings.Contains(usage, "default 20/1s") {
		t.Errorf("-h: %v\n%s", err, usage)
	}
}

// TestThrottleSettingOptions: a Throttle made from a setting spends and
// regrows its budget as the setting says.
func TestThrottleSettingOptions(t *testing.T) {
	t.Parallel()
	if o := (auth.ThrottleSetting{}).Options(nil); o.Burst != 0 || o.Every != 0 {
		t.Errorf("a zero setting's options %+v, want zero (the defaults)", o)
	}
	s, err := auth.ParseThrottleSetting("2/1h")
	if err != nil {
		t.Fatal(err)
	}
	c := newClock()
	var throttled int
	o := s.Options(func(context.Context) { throttled++ })
	o.Now = c.now
	th := auth.NewThrottle(o)
	th.Fail(addr("192.0.2.1"))
	if w := waitOf(th, "192.0.2.1"); w != 0 {
		t.Errorf("after one wrong token of 2: wait %v", w)
	}
	th.Fail(addr("192.0.2.1"))
	if w := th.Refused(context.Background(), addr("192.0.2.1")); w != time.Hour || throttled != 1 {
		t.Errorf("after 2 wrong tokens of 2: wait %v, %d refusals counted; want 1h, 1", w, throttled)
	}
	c.advance(59 * time.Minute)
	if w := waitOf(th, "192.0.2.1"); w != time.Minute {
		t.Errorf("59 minutes later: wait %v, want 1m", w)
	}
	c.advance(time.Minute)
	if w := waitOf(th, "192.0.2.1"); w != 0 {
		t.Errorf("an hour later: wait %v, want 0", w)
	}
}

func FuzzParseThrottleSetting(f *testing.F) {
	for _, s := range []string{"20/1s", "5/1h", "0/1s", "1/0s", "x/y", "", "/", "3/1m30s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := auth.ParseThrottleSetting(in)
		if err != nil {
			return
		}
		if s.Burst < 1 || s.Every <= 0 {
			t.Fatalf("%q accepted as %+v", in, s)
		}
		again, err := auth.ParseThrottleSetting(s.String())
		if err != nil || again != s {
			t.Fatalf("%q: %+v printed as %q reads back as %+v, %v", in, s, s.String(), again, err)
		}
	})
}
