// Package report prints what a client saw as one JSON line on stdout, which the test
// parses, and exits non-zero when it saw a failure.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// Failures collects failures from many goroutines.
type Failures struct {
	mu   sync.Mutex
	list []string
}

// Add records one failure.
func (f *Failures) Add(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, fmt.Sprintf(format, args...))
}

// List returns the failures so far (never nil, so the JSON has a list).
func (f *Failures) List() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string{}, f.list...)
}

// Print writes `v` as one JSON line; exits 1 when `failed`.
func Print(v any, failed bool) {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "report: %v\n", err)
		os.Exit(2)
	}
	fmt.Println(string(b))
	if failed {
		os.Exit(1)
	}
}
