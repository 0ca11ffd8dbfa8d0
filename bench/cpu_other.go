//go:build !unix

package main

import "time"

// processCPU returns -1: the platform's CPU times are not read here.
func processCPU() time.Duration { return -1 }
