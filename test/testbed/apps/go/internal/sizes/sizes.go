// Package sizes reads the clients' -sizes flags: byte counts, comma-separated.
package sizes

import (
	"log"
	"strconv"
	"strings"
)

// Parse reads `list`, e.g. "1,100,65536"; exits on anything but a byte count.
func Parse(list string) []int {
	var sizes []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 {
			log.Fatalf("bad size %q", s)
		}
		sizes = append(sizes, n)
	}
	return sizes
}
