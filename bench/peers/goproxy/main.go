// goproxy: seed 004's Go io.Copy proxy, as a measuring stick for
// tcp_proxy (not part of the product). On Linux, io.Copy between two
// *net.TCPConn is a splice(2) through a pipe, and Go sets TCP_NODELAY on
// every TCP connection by default.
//
// Unlike the seed's, it passes half-close on (CloseWrite after each
// direction's EOF) so connections end and do not leak, and it prints the
// address it really bound, so it can listen on port 0.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	upstream := flag.String("upstream", "", "HOST:PORT to forward to")
	flag.Parse()
	if *upstream == "" {
		fmt.Fprintln(os.Stderr, "goproxy: -upstream is required")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "goproxy:", err)
		os.Exit(1)
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Print(err)
			continue
		}
		go handle(c.(*net.TCPConn), *upstream)
	}
}

func handle(client *net.TCPConn, upstream string) {
	defer client.Close()
	u, err := net.Dial("tcp", upstream)
	if err != nil {
		log.Print(err)
		return
	}
	up := u.(*net.TCPConn)
	defer up.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(up, client)
		up.CloseWrite()
		close(done)
	}()
	io.Copy(client, up)
	client.CloseWrite()
	<-done
}
