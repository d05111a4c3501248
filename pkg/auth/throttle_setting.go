package auth

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ThrottleSetting is a Throttle's budget as an operator sets it, in one
// value BURST/EVERY: an address may present Burst wrong tokens at once and
// one more each Every after that. "20/1s" is the default of every service
// (ThrottleBurst, ThrottleEvery). It is a pkg/config setting type: each
// service's CONCLAVE_<SERVICE>_AUTH_THROTTLE.
type ThrottleSetting struct {
	Burst int
	Every time.Duration
}

// ParseThrottleSetting reads BURST/EVERY: a whole number of at least 1 and
// a positive Go duration, such as 20/1s or 5/1m.
func ParseThrottleSetting(val string) (ThrottleSetting, error) {
	burst, every, ok := strings.Cut(strings.TrimSpace(val), "/")
	if !ok {
		return ThrottleSetting{}, fmt.Errorf("%q is not BURST/EVERY, such as 20/1s", val)
	}
	n, err := strconv.Atoi(strings.TrimSpace(burst))
	if err != nil || n < 1 {
		return ThrottleSetting{}, fmt.Errorf("burst %q in %q is not a whole number of at least 1", burst, val)
	}
	d, err := time.ParseDuration(strings.TrimSpace(every))
	if err != nil || d <= 0 {
		return ThrottleSetting{}, fmt.Errorf("%q in %q is not a positive duration such as 1s or 1m", every, val)
	}
	return ThrottleSetting{Burst: n, Every: d}, nil
}

// EnvDecode implements pkg/config's Decoder.
func (s *ThrottleSetting) EnvDecode(val string) error {
	v, err := ParseThrottleSetting(val)
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// FlagType implements pkg/config's FlagTyper.
func (*ThrottleSetting) FlagType() string { return "burst/every" }

// String is the setting as ParseThrottleSetting reads it.
func (s ThrottleSetting) String() string {
	return strconv.Itoa(s.Burst) + "/" + s.Every.String()
}

// Options are the ThrottleOptions of a service's throttle: the setting's
// budget, and throttled counting the refusals (ThrottleOptions.Throttled).
// A zero setting, one no configuration loaded, takes the package defaults.
func (s ThrottleSetting) Options(throttled func(context.Context)) ThrottleOptions {
	return ThrottleOptions{Burst: s.Burst, Every: s.Every, Throttled: throttled}
}
