// Package steps lets a test hold a client between connecting and sending: the client
// creates a file once connected and waits for another before its first byte, so the
// test can see both ends of every connection paired first (a client that sends before
// its server's end is paired keeps that direction on TCP, by the datapath's design).
package steps

import (
	"flag"
	"fmt"
	"log"
	"os"
	"time"
)

// Gate is a client's -connected-file and -go-file.
type Gate struct {
	connected, goFile *string
}

// Flags declares -connected-file and -go-file; call before flag.Parse.
func Flags() Gate {
	return Gate{
		connected: flag.String("connected-file", "", "file to create once connected"),
		goFile:    flag.String("go-file", "", "file to wait for before the first send"),
	}
}

// Net is how long a held client waits for its -go-file: a net for a test that died
// without killing it (the test opens the gate once it has seen the pairings it waits
// for), never a pace.
const Net = 15 * time.Minute

// Hold creates the -connected-file, then waits for the -go-file, at most [Net]
// ([Connected], [WaitGo]); exits on failure.
func (g Gate) Hold() {
	if err := Connected(*g.connected); err != nil {
		log.Fatal(err)
	}
	if err := WaitGo(*g.goFile, Net); err != nil {
		log.Fatal(err)
	}
}

// Connected creates `file` (when not empty).
func Connected(file string) error {
	if file == "" {
		return nil
	}
	return os.WriteFile(file, nil, 0o644)
}

// WaitGo waits until `file` exists (at once when empty), at most `within`.
func WaitGo(file string, within time.Duration) error {
	if file == "" {
		return nil
	}
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(file); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the go file %s did not appear within %v", file, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
