// Command httpserver is a Go net/http server with two routes: GET /bytes?n=N&seed=S
// answers N bytes of stream 0 of pattern seed S (with a Content-Length), and POST
// /sha256 answers "<sha256> <bytes>" of the request body.
package main

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"

	"bypass.local/apps/internal/pattern"
	"bypass.local/apps/internal/serve"
)

func main() {
	addr := serve.Flags()
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err1 := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		seed, err2 := strconv.ParseUint(r.URL.Query().Get("seed"), 10, 64)
		if err1 != nil || err2 != nil || n < 0 {
			http.Error(w, "want ?n=BYTES&seed=SEED", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		if _, err := io.CopyN(w, pattern.New(seed, 0), n); err != nil {
			log.Printf("GET %s: %v", r.URL, err)
		}
	})
	mux.HandleFunc("POST /sha256", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%x %d", h.Sum(nil), n)
	})
	log.Fatal(http.Serve(addr.Listen(), mux))
}
