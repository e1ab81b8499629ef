package podstate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/sets"
)

// Upstream TestPodContainerDeviceToAllocate, in our words, and one case per
// pre-check rule, in the kubelet's order.
func TestCheckRequest(t *testing.T) {
	const res3 = "domain2.com/resource3"
	healthy := sets.New("dev1", "dev2")
	cases := []struct {
		name       string
		c          RequestCheck
		wantNeeded int
		wantErr    string
		wantIs     error
	}{
		{name: "fresh request",
			c:          RequestCheck{Resource: res1, Required: 2, Registered: true, Healthy: healthy},
			wantNeeded: 2},
		{name: "registered, no healthy device",
			c:       RequestCheck{Resource: res1, Required: 1, Registered: true, Healthy: sets.New[string]()},
			wantErr: "no healthy devices present; cannot allocate unhealthy devices domain1.com/resource1",
			wantIs:  ErrNoHealthyDevices},
		{name: "unregistered",
			c:       RequestCheck{Resource: "domain2.com/resource2", Required: 1},
			wantErr: "cannot allocate unregistered device domain2.com/resource2",
			wantIs:  ErrUnregisteredResource},
		{name: "held device no longer healthy",
			c: RequestCheck{Resource: res3, Required: 1, Held: sets.New("dev5"), Registered: true,
				Healthy: sets.New("dev7", "dev8")},
			wantErr: "previously allocated devices are no longer healthy; cannot allocate unhealthy devices domain2.com/resource3",
			wantIs:  ErrAllocatedDeviceUnhealthy},
		{name: "held devices healthy: nothing more to pick",
			c:          RequestCheck{Resource: res1, Required: 2, Held: sets.New("dev1", "dev2"), Registered: true, Healthy: healthy},
			wantNeeded: 0},
		{name: "changed request comes first, even when unregistered",
			c:       RequestCheck{PodUID: "pod", ContainerName: "ctr", Resource: res1, Required: 3, Held: sets.New("dev1")},
			wantErr: `pod "pod" container "ctr" changed request for resource "domain1.com/resource1" from 1 to 3`,
			wantIs:  ErrRequestChanged},
		{name: "empty record counts as a record",
			c:       RequestCheck{PodUID: "pod", ContainerName: "ctr", Resource: res1, Required: 1, Held: sets.New[string]()},
			wantErr: `pod "pod" container "ctr" changed request for resource "domain1.com/resource1" from 0 to 1`,
			wantIs:  ErrRequestChanged},
		{name: "already running while sources not ready: no health checks",
			c:          RequestCheck{Resource: res1, Required: 2, AlreadyRunning: true},
			wantNeeded: 0},
		{name: "already running does not hide a changed request",
			c:       RequestCheck{PodUID: "p", ContainerName: "c", Resource: res1, Required: 2, Held: sets.New("dev1"), AlreadyRunning: true},
			wantErr: `pod "p" container "c" changed request for resource "domain1.com/resource1" from 1 to 2`,
			wantIs:  ErrRequestChanged},
		{name: "zero request still fails without healthy devices",
			c:       RequestCheck{Resource: res1, Required: 0, Registered: true},
			wantErr: "no healthy devices present; cannot allocate unhealthy devices domain1.com/resource1",
			wantIs:  ErrNoHealthyDevices},
		{name: "zero request on a healthy resource: nothing to pick",
			c:          RequestCheck{Resource: res1, Required: 0, Registered: true, Healthy: healthy},
			wantNeeded: 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			needed, err := CheckRequest(tc.c)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				require.ErrorIs(t, err, tc.wantIs)
				assert.Zero(t, needed)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantNeeded, needed)
		})
	}
}

func TestCheckRequestErrorTypes(t *testing.T) {
	_, err := CheckRequest(RequestCheck{Resource: res1})
	var re *ResourceError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, res1, re.Resource)
	assert.NotErrorIs(t, err, ErrNoHealthyDevices)

	_, err = CheckRequest(RequestCheck{PodUID: "p", ContainerName: "c", Resource: res1, Required: 2, Held: sets.New("x")})
	require.ErrorIs(t, err, ErrRequestChanged)
	assert.NotErrorAs(t, err, &re)
	assert.EqualError(t, err, `pod "p" container "c" changed request for resource "`+res1+`" from 1 to 2`)
}
