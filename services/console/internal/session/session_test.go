package session

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func newCodec(t *testing.T, key []byte) *Codec {
	t.Helper()
	c, err := NewCodec(key, time.Hour, false)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRoundTripKeepsTokensSecretInTheCookie(t *testing.T) {
	t.Parallel()
	c := newCodec(t, GenerateKey())
	s := c.New(Tokens{Gateway: "gw-secret-token", Bus: "bus-secret", Reviewer: "lib_r_secret"}, false)
	ck, err := c.Cookie(s)
	if err != nil {
		t.Fatal(err)
	}
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" {
		t.Errorf("cookie attributes: %+v", ck)
	}
	for _, secret := range []string{"gw-secret-token", "bus-secret", "lib_r_secret"} {
		if strings.Contains(ck.Value, secret) {
			t.Fatalf("the cookie shows a token in clear: %s", ck.Value)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.AddCookie(ck)
	got, err := c.Read(r)
	if err != nil {
		t.Fatal(err)
	}
	if got != s {
		t.Fatalf("read %+v, want %+v", got, s)
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	c := newCodec(t, GenerateKey())
	other := newCodec(t, GenerateKey())
	good, err := c.Encode(c.New(Tokens{Gateway: "t"}, false))
	if err != nil {
		t.Fatal(err)
	}
	fromOther, _ := other.Encode(other.New(Tokens{Gateway: "t"}, false))
	expired := c.New(Tokens{}, false)
	expired.Expires = time.Now().Add(-time.Second).Unix()
	expiredValue, _ := c.Encode(expired)
	noID, _ := c.Encode(Session{Expires: time.Now().Add(time.Hour).Unix()})
	flipped := []byte(good)
	flipped[len(flipped)/2] ^= 1
	tests := []struct {
		name, value string
		want        error
	}{
		{"empty", "", ErrNoSession},
		{"not base64", "!!!", ErrInvalid},
		{"too short", "AAAA", ErrInvalid},
		{"a bit flipped", string(flipped), ErrInvalid},
		{"sealed under another key", fromOther, ErrInvalid},
		{"oversized", strings.Repeat("A", maxCookieBytes+1), ErrInvalid},
		{"without an id", noID, ErrInvalid},
		{"expired", expiredValue, ErrExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := c.Decode(tt.value); !errors.Is(err, tt.want) {
				t.Fatalf("Decode: %v, want %v", err, tt.want)
			}
		})
	}
}

func TestSessionExpiresWithTheClock(t *testing.T) {
	t.Parallel()
	c := newCodec(t, GenerateKey())
	now := time.Now()
	c.SetClock(func() time.Time { return now })
	v, _ := c.Encode(c.New(Tokens{}, false))
	if _, err := c.Decode(v); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if _, err := c.Decode(v); !errors.Is(err, ErrExpired) {
		t.Fatalf("an hour later: %v, want ErrExpired", err)
	}
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	c := newCodec(t, GenerateKey())
	a, b := c.New(Tokens{}, false), c.New(Tokens{}, false)
	other := newCodec(t, GenerateKey())
	tests := []struct {
		name  string
		token string
		ok    bool
	}{
		{"its own", c.CSRFToken(a), true},
		{"none", "", false},
		{"another session's", c.CSRFToken(b), false},
		{"the same session under another key", other.CSRFToken(a), false},
		{"truncated", c.CSRFToken(a)[:10], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := c.CheckCSRF(a, tt.token); got != tt.ok {
				t.Fatalf("CheckCSRF = %v, want %v", got, tt.ok)
			}
		})
	}
}

func TestNewCodecRefusesBadSettings(t *testing.T) {
	t.Parallel()
	if _, err := NewCodec(make([]byte, 16), time.Hour, false); err == nil {
		t.Error("a 16-byte key was accepted")
	}
	if _, err := NewCodec(GenerateKey(), 0, false); err == nil {
		t.Error("a zero lifetime was accepted")
	}
}
