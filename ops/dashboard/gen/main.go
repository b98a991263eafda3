// Command gen writes the dashboard (package dashboard) to
// dedup-dashboard.json in the dashboard package's folder, or to the file
// named by -o. Run it from the ops module (go generate ./dashboard/ runs it
// in that folder).
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/watermill-dedup/watermill-dedup/ops/dashboard"
)

func main() {
	out := flag.String("o", dashboard.File, "file to write")
	flag.Parse()
	b, err := dashboard.JSON()
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
