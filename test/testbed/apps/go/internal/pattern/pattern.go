// Package pattern makes the byte streams the clients send and check: random-looking,
// and the same bytes for the same (seed, stream) in every program and on every run, so
// a receiver regenerates what it should get instead of being told.
package pattern

import (
	"encoding/binary"
	"math/rand/v2"
)

// New returns the generator of stream `stream` of `seed`; its Read never fails.
func New(seed, stream uint64) *rand.ChaCha8 {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[0:], seed)
	binary.LittleEndian.PutUint64(key[8:], stream)
	copy(key[16:], "bypass-apps-strm")
	return rand.NewChaCha8(key)
}

// Bytes returns the first n bytes of stream `stream` of `seed`.
func Bytes(seed, stream uint64, n int) []byte {
	b := make([]byte, n)
	_, _ = New(seed, stream).Read(b)
	return b
}
