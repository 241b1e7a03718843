module netspeed/bench/peers/goproxy

go 1.19
