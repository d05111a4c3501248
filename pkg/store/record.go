package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The embedded backend's on-disk formats. Keys sort like DynamoDB's: all of
// a partition together, then sort keys by their UTF-8 bytes.

// boltKey is uvarint(len(pk)) | pk | sk.
func boltKey(pk, sk string) []byte {
	b := make([]byte, 0, binary.MaxVarintLen64+len(pk)+len(sk))
	b = binary.AppendUvarint(b, uint64(len(pk)))
	b = append(b, pk...)
	return append(b, sk...)
}

func splitBoltKey(k []byte) (Key, error) {
	n, w := binary.Uvarint(k)
	// Only the canonical (shortest) length prefix is one boltKey writes.
	if w <= 0 || w != len(binary.AppendUvarint(nil, n)) || uint64(len(k)-w) < n {
		return Key{}, errors.New("corrupt key")
	}
	return Key{PK: string(k[w : w+int(n)]), SK: string(k[w+int(n):])}, nil
}

const recordVersion = 1

// attrPrefix marks service attributes among an item's DynamoDB attributes.
const attrPrefix = "a_"

// encodeRecord is version | item version | counter | expiry (unix ms, 0 for
// never) | data | attribute count | (name, value)*.
func encodeRecord(it Item) []byte {
	b := make([]byte, 0, 32+len(it.Data)+32*len(it.Attrs))
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, uint64(it.Version))
	b = binary.AppendVarint(b, it.Counter)
	var exp int64
	if !it.ExpiresAt.IsZero() {
		exp = it.ExpiresAt.UnixMilli()
	}
	b = binary.AppendVarint(b, exp)
	b = appendBytes(b, it.Data)
	b = binary.AppendUvarint(b, uint64(len(it.Attrs)))
	for k, v := range it.Attrs {
		b = appendBytes(b, []byte(k))
		b = appendBytes(b, []byte(v))
	}
	return b
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

var errCorrupt = errors.New("corrupt record")

// decodeRecord parses a stored record. The file may be damaged or written by
// another version, so every length is checked.
func decodeRecord(key Key, b []byte) (Item, error) {
	it := Item{Key: key}
	if len(b) == 0 || b[0] != recordVersion {
		return it, fmt.Errorf("%w: unknown record version", errCorrupt)
	}
	r := reader{b: b[1:]}
	it.Version = int64(r.uvarint())
	it.Counter = r.varint()
	if exp := r.varint(); exp != 0 {
		it.ExpiresAt = time.UnixMilli(exp)
	}
	if d := r.bytes(); len(d) > 0 {
		it.Data = d
	}
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		return it, errCorrupt
	}
	if n > 0 {
		it.Attrs = make(map[string]string, n)
	}
	for range n {
		k, v := r.bytes(), r.bytes()
		it.Attrs[string(k)] = string(v)
	}
	if r.err != nil || len(r.b) != 0 {
		return it, errCorrupt
	}
	return it, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errCorrupt
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errCorrupt
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errCorrupt
		return nil
	}
	v := make([]byte, n)
	copy(v, r.b[:n])
	r.b = r.b[n:]
	return v
}
