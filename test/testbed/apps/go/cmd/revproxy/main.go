// Command revproxy is a Go HTTP reverse proxy (net/http/httputil.ReverseProxy) in
// front of -upstream.
package main

import (
	"flag"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"

	"bypass.local/apps/internal/serve"
)

func main() {
	addr := serve.Flags()
	upstream := flag.String("upstream", "", "base URL of the server, e.g. http://10.0.0.1:8080")
	flag.Parse()
	target, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("-upstream: %v", err)
	}
	log.Fatal(http.Serve(addr.Listen(), httputil.NewSingleHostReverseProxy(target)))
}
