// Package reliability is devmgr's reliability suite: crash consistency under
// SIGKILL and under power loss (on LazyFS), of the library and of devmgr
// serve, plugin faults, churn, bad registrations, checkpoint damage, load
// and permissions, each test asserting that no allocation is lost or given
// twice. The tests carry the build tag "reliability" and run with
// `make reliability LAZYFS=PATH` (part of .ci/run) with bounded counts;
// flags raise them (see main_test.go). docs/RELIABILITY.md holds the figures
// of the last run.
package reliability
