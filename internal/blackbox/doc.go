// Package blackbox is the team's own black-box test suite for devmgr. Its
// tests (package blackbox_test) are written only from the stable surface and
// the rules of DESIGN.md and from the kubelet behaviour described in SPEC.md,
// and drive the public packages devicemanager, topology, podstate and
// checkpoint through a small fake device plugin of their own, exactly as an
// external consumer would; they never use plugintest or unexported names.
package blackbox
