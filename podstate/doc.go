// Package podstate is the Device Manager's allocation ledger and its pure
// allocation decisions.
//
// A [Ledger] records, per pod, container and resource, the devices the
// container holds (per NUMA node, as the checkpoint stores them) and the
// plugin's ContainerAllocateResponse. Around the records it keeps:
//
//   - pending reservations: devices picked for a plugin Allocate call in
//     flight are in use from [Ledger.Reserve] until [Ledger.Commit] turns them
//     into a record or [Ledger.Rollback] frees them. Garbage collection of
//     inactive pods ([Ledger.DeletePods]) never frees a reservation;
//   - an index resource -> device ID -> holders, updated on every change, so
//     [Ledger.IsAllocated], [Ledger.AllocatedCount] and [Ledger.Owners] cost
//     O(1) or O(owners) and [Ledger.Allocated] O(allocated devices), never
//     O(pods x devices).
//
// The same history always converts to the same checkpoint entries, in
// admission order ([Ledger.ToCheckpoint]), merges run options in the same order
// ([Ledger.RunOptions]) and renders the same podresources view
// ([Ledger.DeviceView]). Device IDs are opaque strings, kept byte for byte;
// the same ID under two resources names two devices.
//
// The decisions are functions of their input: [CheckRequest] runs the
// admission pre-checks, [PreferredQueryFor] and [Select] pick devices (reuse
// pool, NUMA-aligned tier, the plugin's preference, the other tiers) without
// touching any state, and return errors with the kubelet's texts that match
// this package's sentinels with errors.Is.
//
// # Concurrency
//
// Nothing here is safe for concurrent use, and nothing locks, blocks, starts
// goroutines, reads clocks or does I/O. The caller (package devicemanager)
// holds its mutex around every call and does the gRPC and disk work itself.
//
// # Lifecycle
//
// A typical admission of one container and resource, with the caller's lock
// dropped only around plugin calls:
//
//  1. under the lock: CheckRequest; build a SelectInput from the healthy set
//     minus Ledger.Allocated, the reuse pool and the NUMA tiers;
//     PreferredQueryFor tells whether to ask the plugin;
//  2. unlocked: GetPreferredAllocation if needed;
//  3. under the lock: rebuild the SelectInput (state may have changed), Select,
//     then Reserve the picks;
//  4. unlocked: the plugin's Allocate;
//  5. under the lock: Commit the reservation with the response, or Rollback
//     on error; if another resource of the container fails,
//     DeleteContainerResources undoes the ones already committed;
//  6. ToCheckpoint, and write it.
//
// At start, FromCheckpoint restores the records written before.
package podstate
