// Package session keeps a console user's sign-in in an encrypted cookie:
// the services' bearer tokens, sealed with AES-256-GCM so that neither the
// browser's JavaScript (the cookie is HttpOnly) nor anyone reading the
// cookie jar learns them, and CSRF tokens derived from the session's random
// id with a separate HMAC key.
package session

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// CookieName is the session cookie.
const CookieName = "conclave_console"

// KeySize is the length of the key given to NewCodec.
const KeySize = 32

// maxCookieBytes bounds what Read decodes: browsers keep at most 4 KB per
// cookie anyway.
const maxCookieBytes = 4096

// MaxTokenBytes bounds each token at sign-in, so that five of them always
// fit in one cookie.
const MaxTokenBytes = 512

// Errors of Read and Decode.
var (
	ErrNoSession = errors.New("no session")
	ErrInvalid   = errors.New("the session cookie is not valid")
	ErrExpired   = errors.New("the session has expired")
)

// Tokens are the bearer tokens a person signed in with, one per service.
// An empty token means the service is called without one.
type Tokens struct {
	Gateway        string `json:"g,omitempty"`
	Bus            string `json:"b,omitempty"`
	Runner         string `json:"r,omitempty"`
	Reviewer       string `json:"lr,omitempty"`
	LibrarianAgent string `json:"la,omitempty"`
}

// Session is what the cookie holds.
type Session struct {
	// ID is random; it keys the session's CSRF token and owns its chats.
	ID     string `json:"id"`
	Tokens Tokens `json:"t"`
	// Expires is in Unix seconds; the cookie's own Max-Age is only a hint
	// to the browser, this is what counts.
	Expires int64 `json:"exp"`
	// Open marks a session minted without sign-in, on a console that
	// allows it (conclave dev on loopback).
	Open bool `json:"open,omitempty"`
}

// Codec seals and opens sessions.
type Codec struct {
	aead    cipher.AEAD
	csrfKey []byte
	ttl     time.Duration
	secure  bool
	now     func() time.Time
}

// GenerateKey returns a fresh random key, for a console started without one.
func GenerateKey() []byte {
	k := make([]byte, KeySize)
	_, _ = rand.Read(k) // crypto/rand.Read never fails (Go 1.24+)
	return k
}

// NewCodec makes a codec from a 32-byte key. Two keys are derived from it,
// one for encryption and one for CSRF tokens, so that neither use can leak
// the other. secure sets the cookie's Secure attribute (the console is
// served over https).
func NewCodec(key []byte, ttl time.Duration, secure bool) (*Codec, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("session key: want %d bytes, got %d", KeySize, len(key))
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("session lifetime must be positive, got %s", ttl)
	}
	block, err := aes.NewCipher(derive(key, "conclave console session encryption"))
	if err != nil {
		return nil, fmt.Errorf("session cipher: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("session cipher: %w", err)
	}
	return &Codec{aead: aead, csrfKey: derive(key, "conclave console csrf"), ttl: ttl, secure: secure, now: time.Now}, nil
}

func derive(key []byte, purpose string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

// SetClock replaces the codec's clock, for tests.
func (c *Codec) SetClock(now func() time.Time) { c.now = now }

// TTL is how long a new session lasts.
func (c *Codec) TTL() time.Duration { return c.ttl }

// New starts a session with tokens, lasting the codec's lifetime.
func (c *Codec) New(tokens Tokens, open bool) Session {
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	return Session{ID: hex.EncodeToString(id), Tokens: tokens, Expires: c.now().Add(c.ttl).Unix(), Open: open}
}

// Encode seals s: base64url(nonce || AES-GCM(JSON)), with the cookie name
// as additional data so that the value cannot be replayed as another cookie.
func (c *Codec) Encode(s Session) (string, error) {
	plain, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("encode session: %w", err)
	}
	nonce := make([]byte, c.aead.NonceSize(), c.aead.NonceSize()+len(plain)+c.aead.Overhead())
	_, _ = rand.Read(nonce)
	sealed := c.aead.Seal(nonce, nonce, plain, []byte(CookieName))
	return base64.RawURLEncoding.EncodeToString(sealed), nil
}

// Decode opens a cookie value. It fails with ErrInvalid for anything it did
// not seal itself (or sealed under another key) and ErrExpired past the
// session's expiry.
func (c *Codec) Decode(value string) (Session, error) {
	if value == "" {
		return Session{}, ErrNoSession
	}
	if len(value) > maxCookieBytes {
		return Session{}, ErrInvalid
	}
	sealed, err := base64.RawURLEncoding.DecodeString(value)
	if err != nil || len(sealed) < c.aead.NonceSize()+c.aead.Overhead() {
		return Session{}, ErrInvalid
	}
	nonce, body := sealed[:c.aead.NonceSize()], sealed[c.aead.NonceSize():]
	plain, err := c.aead.Open(nil, nonce, body, []byte(CookieName))
	if err != nil {
		return Session{}, ErrInvalid
	}
	var s Session
	if err := json.Unmarshal(plain, &s); err != nil || s.ID == "" {
		return Session{}, ErrInvalid
	}
	if !c.now().Before(time.Unix(s.Expires, 0)) {
		return Session{}, ErrExpired
	}
	return s, nil
}

// Read returns the request's session: ErrNoSession without a cookie.
func (c *Codec) Read(r *http.Request) (Session, error) {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return Session{}, ErrNoSession
	}
	return c.Decode(ck.Value)
}

// Cookie is the Set-Cookie for s.
func (c *Codec) Cookie(s Session) (*http.Cookie, error) {
	v, err := c.Encode(s)
	if err != nil {
		return nil, err
	}
	maxAge := int(time.Until(time.Unix(s.Expires, 0)).Seconds())
	if maxAge < 1 {
		maxAge = 1
	}
	return &http.Cookie{Name: CookieName, Value: v, Path: "/", HttpOnly: true, Secure: c.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: maxAge}, nil
}

// Clear is the Set-Cookie that removes the session.
func (c *Codec) Clear() *http.Cookie {
	return &http.Cookie{Name: CookieName, Value: "", Path: "/", HttpOnly: true, Secure: c.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: -1}
}

// CSRFToken is the token every form and state-changing call of s carries.
func (c *Codec) CSRFToken(s Session) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte("csrf:" + s.ID))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckCSRF reports whether token is s's, in constant time.
func (c *Codec) CheckCSRF(s Session, token string) bool {
	return token != "" && hmac.Equal([]byte(token), []byte(c.CSRFToken(s)))
}
