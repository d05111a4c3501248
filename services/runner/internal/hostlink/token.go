package hostlink

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"strings"

	"google.golang.org/grpc/metadata"
)

// Token is agent-host's credential for instanceID: HMAC-SHA256 of the
// instance id under the runner's key, hex. It is stateless, so a restarted
// runner, or another replica with the same key, accepts the same pod.
func Token(key []byte, instanceID string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(instanceID))
	return hex.EncodeToString(m.Sum(nil))
}

// bearer is the token of a call's `authorization: Bearer <token>` metadata.
func bearer(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if t, ok := strings.CutPrefix(v, "Bearer "); ok {
			return t
		}
	}
	return ""
}

// validToken compares in constant time.
func validToken(key []byte, instanceID, token string) bool {
	want := Token(key, instanceID)
	return len(token) == len(want) && subtle.ConstantTimeCompare([]byte(token), []byte(want)) == 1
}
