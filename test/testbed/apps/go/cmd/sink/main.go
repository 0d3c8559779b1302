// Command sink reads each connection to its end with plain Reads and answers with the
// SHA-256 and length of what it read ("<hex> <bytes>\n"), then closes: a server whose
// reply proves every byte arrived, in order.
package main

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log"
	"net"

	"bypass.local/apps/internal/serve"
)

func main() {
	addr := serve.Flags()
	flag.Parse()
	serve.Accept(addr.Listen(), func(c *net.TCPConn) {
		defer c.Close()
		h := sha256.New()
		buf := make([]byte, 64<<10)
		var total int64
		for {
			n, err := c.Read(buf)
			h.Write(buf[:n])
			total += int64(n)
			if err == io.EOF {
				break
			}
			if err != nil {
				log.Printf("sink %s: %v after %d bytes", c.RemoteAddr(), err, total)
				return
			}
		}
		if _, err := fmt.Fprintf(c, "%x %d\n", h.Sum(nil), total); err != nil {
			log.Printf("sink %s: reply: %v", c.RemoteAddr(), err)
		}
	})
}
