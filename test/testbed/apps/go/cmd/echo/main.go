// Command echo is a TCP echo server: with -mode copy it echoes with io.Copy(conn, conn),
// Go's standard pattern (splice(2) underneath); with -mode rw through a plain
// Read/Write loop. Each connection is half-closed once its client half-closed and
// everything was echoed.
package main

import (
	"flag"
	"log"
	"net"

	"bypass.local/apps/internal/relay"
	"bypass.local/apps/internal/serve"
)

func main() {
	addr := serve.Flags()
	mode := relay.Flag(relay.ReadWrite)
	flag.Parse()
	serve.Accept(addr.Listen(), func(c *net.TCPConn) {
		defer c.Close()
		if _, err := relay.Move(c, c, *mode); err != nil {
			log.Printf("echo %s: %v", c.RemoteAddr(), err)
		}
	})
}
