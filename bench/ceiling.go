package main

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

var rpsPattern = regexp.MustCompile(`([0-9.]+) requests per second`)

// ceiling runs redis-benchmark with clients connections, each with depth
// calls in flight, sending command (EVALSHA of a script already loaded) as
// fast as the server takes them, and returns the requests per second it
// reports. With depth 1 it is the limit for one round trip per decision on
// this server and machine; pipelined, the server's own.
func ceiling(host string, port, clients, depth, requests, randomKeys int, command ...string) (float64, error) {
	cmdArgs := []string{"-h", host, "-p", strconv.Itoa(port), "-c", strconv.Itoa(clients), "-P", strconv.Itoa(depth), "-n", strconv.Itoa(requests), "-q"}
	if randomKeys > 0 {
		cmdArgs = append(cmdArgs, "-r", strconv.Itoa(randomKeys))
	}
	cmdArgs = append(cmdArgs, command...)
	out, err := exec.Command("redis-benchmark", cmdArgs...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("redis-benchmark: %w: %s", err, out)
	}
	// -q redraws its progress with carriage returns; the total comes last.
	text := string(out)
	if i := strings.LastIndex(text, "\r"); i >= 0 {
		text = text[i:]
	}
	m := rpsPattern.FindAllStringSubmatch(text, -1)
	if len(m) == 0 {
		return 0, fmt.Errorf("redis-benchmark said: %s", out)
	}
	return strconv.ParseFloat(m[len(m)-1][1], 64)
}
