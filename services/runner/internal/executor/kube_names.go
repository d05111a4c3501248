package executor

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Instance and task ids come from API clients: they need not be valid
// Kubernetes names or label values. An id that is one is used as it is, so
// that kubectl shows it; any other is reduced to the characters allowed and
// given a hash of the whole id, so that two ids never share a name (short of
// a collision of 48 bits of SHA-256). The exact ids are in annotations.

const hashLen = 12

func idHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])[:hashLen]
}

// jobName is the Job (and Secret) of one launch of an instance: a DNS-1123
// label of at most 63 characters, "agent-<id>-<launch>".
func jobName(instanceID string, launch int64) string {
	const prefix = "agent-"
	suffix := "-" + strconv.FormatInt(launch, 10)
	if launch < 0 {
		suffix = "-n" + strconv.FormatInt(-launch, 10)
	}
	budget := validation.DNS1123LabelMaxLength - len(prefix) - len(suffix)
	if len(instanceID) <= budget && instanceID != "" && strings.Trim(instanceID, "abcdefghijklmnopqrstuvwxyz0123456789-") == "" {
		return prefix + instanceID + suffix
	}
	var b strings.Builder
	for _, r := range strings.ToLower(instanceID) {
		if b.Len() >= budget-hashLen-1 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			b.WriteRune(r)
		} else if s := b.String(); s != "" && !strings.HasSuffix(s, "-") {
			b.WriteByte('-')
		}
	}
	if s := b.String(); s != "" && !strings.HasSuffix(s, "-") {
		b.WriteByte('-')
	}
	return prefix + b.String() + idHash(instanceID) + suffix
}

// labelValue is id as a label value: id itself when valid, else the
// characters allowed, at most 50, and a hash.
func labelValue(id string) string {
	if len(validation.IsValidLabelValue(id)) == 0 {
		return id
	}
	var b strings.Builder
	for _, r := range id {
		if b.Len() >= validation.LabelValueMaxLength-hashLen-1 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && (r == '-' || r == '_' || r == '.'):
			b.WriteRune(r)
		}
	}
	s := strings.TrimRight(b.String(), "-_.")
	if s != "" {
		s += "-"
	}
	return s + idHash(id)
}
