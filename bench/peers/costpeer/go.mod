module netspeed/bench/peers/costpeer

go 1.19
