// Package serve opens the servers' listeners and tells the test they listen: the ready
// file is created only once the socket accepts connections.
package serve

import (
	"flag"
	"log"
	"net"
	"os"
)

// Addr is where a server listens and the ready file it creates then, as its -listen and
// -ready-file flags say.
type Addr struct {
	listen, readyFile *string
}

// Flags declares -listen and -ready-file, every server's; call before flag.Parse.
func Flags() Addr {
	return Addr{
		listen:    flag.String("listen", "", "address:port to listen on"),
		readyFile: flag.String("ready-file", "", "file to create once listening"),
	}
}

// Listen is [Listen] with the flags' values; call after flag.Parse.
func (a Addr) Listen() *net.TCPListener {
	return Listen(*a.listen, *a.readyFile)
}

// Listen listens on TCP `addr` and then creates `readyFile` (when not empty); exits on
// failure, since a server that cannot listen has nothing to do.
func Listen(addr, readyFile string) *net.TCPListener {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatalf("listen on %s: %v", addr, err)
	}
	Ready(readyFile)
	return ln.(*net.TCPListener)
}

// Ready creates `readyFile` (when not empty); exits on failure.
func Ready(readyFile string) {
	if readyFile == "" {
		return
	}
	if err := os.WriteFile(readyFile, nil, 0o644); err != nil {
		log.Fatalf("write ready file %s: %v", readyFile, err)
	}
}

// Accept calls `handle` on a goroutine for each accepted connection, forever.
func Accept(ln *net.TCPListener, handle func(*net.TCPConn)) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			log.Fatalf("accept: %v", err)
		}
		go handle(c)
	}
}
