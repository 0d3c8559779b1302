// Command l4proxy is a TCP proxy: each accepted connection gets its own connection to
// -upstream, and bytes are moved both ways with io.Copy (-mode copy, splice(2)
// underneath, the standard Go L4 proxy) or a plain Read/Write loop (-mode rw); a
// half-close is passed on.
package main

import (
	"flag"
	"log"
	"net"
	"sync"

	"bypass.local/apps/internal/relay"
	"bypass.local/apps/internal/serve"
)

func main() {
	addr := serve.Flags()
	upstream := flag.String("upstream", "", "address:port to connect each client to")
	mode := relay.Flag(relay.Copy)
	flag.Parse()
	serve.Accept(addr.Listen(), func(c *net.TCPConn) {
		defer c.Close()
		conn, err := net.Dial("tcp", *upstream)
		if err != nil {
			log.Printf("dial %s: %v", *upstream, err)
			return
		}
		up := conn.(*net.TCPConn)
		defer up.Close()
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := relay.Move(up, c, *mode); err != nil {
				log.Printf("client %s to upstream: %v", c.RemoteAddr(), err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := relay.Move(c, up, *mode); err != nil {
				log.Printf("upstream to client %s: %v", c.RemoteAddr(), err)
			}
		}()
		wg.Wait()
	})
}
