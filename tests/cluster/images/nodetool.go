// nodetool: the static test helper in the real node's wmrl.local/nodetool image (tests/cluster,
// "Real node"). No registry is reachable here, so the tests' Pods run this instead of busybox.
//
//	nodetool serve [-port 8080] [-text TEXT]   HTTP server answering TEXT on every path
//	nodetool get [-ca FILE] [-token FILE] URL  GET URL, print the body; exit 1 unless 2xx
//	nodetool lookup NAME                       resolve NAME through /etc/resolv.conf
//	nodetool cat FILE...                       print files
//	nodetool echo WORD...                      print the words
//	nodetool sleep [SECONDS]                   sleep (forever without SECONDS)
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nodetool: "+format+"\n", args...)
	os.Exit(1)
}

func untilSignal() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
}

func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	port := fs.Int("port", 8080, "port")
	text := fs.String("text", "ok", "answer")
	fs.Parse(args)
	host, _ := os.Hostname()
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		fail("listen: %v", err)
	}
	fmt.Printf("nodetool: serving %q on :%d (host %s)\n", *text, *port, host)
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, *text)
	}))
	untilSignal()
}

func get(args []string) {
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	ca := fs.String("ca", "", "PEM file of the CA to verify the server with")
	token := fs.String("token", "", "file holding a bearer token")
	timeout := fs.Duration("timeout", 10*time.Second, "timeout")
	fs.Parse(args)
	if fs.NArg() != 1 {
		fail("get: want one URL, got %q", fs.Args())
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		if err != nil {
			fail("get: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			fail("get: no certificate in %s", *ca)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	req, err := http.NewRequest(http.MethodGet, fs.Arg(0), nil)
	if err != nil {
		fail("get: %v", err)
	}
	if *token != "" {
		b, err := os.ReadFile(*token)
		if err != nil {
			fail("get: %v", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
	}
	resp, err := (&http.Client{Transport: tr, Timeout: *timeout}).Do(req)
	if err != nil {
		fail("get: %v", err)
	}
	defer resp.Body.Close()
	io.Copy(os.Stdout, resp.Body)
	if resp.StatusCode/100 != 2 {
		fail("get: %s", resp.Status)
	}
}

func lookup(args []string) {
	if len(args) != 1 {
		fail("lookup: want one name, got %q", args)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, args[0])
	if err != nil {
		fail("lookup: %v", err)
	}
	for _, a := range addrs {
		fmt.Println(a)
	}
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: nodetool serve|get|lookup|cat|echo|sleep ...")
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "serve":
		serve(args)
	case "get":
		get(args)
	case "lookup":
		lookup(args)
	case "cat":
		for _, f := range args {
			b, err := os.ReadFile(f)
			if err != nil {
				fail("cat: %v", err)
			}
			os.Stdout.Write(b)
		}
	case "echo":
		fmt.Println(strings.Join(args, " "))
	case "sleep":
		if len(args) == 0 {
			untilSignal()
			return
		}
		s, err := strconv.ParseFloat(args[0], 64)
		if err != nil {
			fail("sleep: %v", err)
		}
		time.Sleep(time.Duration(s * float64(time.Second)))
	default:
		fail("unknown command %q", os.Args[1])
	}
}
