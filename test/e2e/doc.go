// Package e2e tests the gpucr binary from outside, as its users run it: built once, run
// against real CRIU, runc and MinIO on real process trees and containers. It holds no code.
package e2e
