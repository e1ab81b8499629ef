package checkpoint

// An fnvTransfer is what hashing one fixed text does to any FNV-1a state, so
// that the text can be hashed again from a new state in constant time.
//
// Why it exists: the checksum is FNV-1a over the whole document, and entries
// are sorted by pod UID, so an admission lands at a random place and every
// entry after it must be hashed again from the new state. With a transfer,
// "again" costs two lookups instead of a pass over the entry's text.
//
// Why it works: a step is h' = (h ^ c) * p. The xor touches only the low
// byte of h, so h ^ c = h + d with d depending only on that low byte and c;
// and the low byte of a product mod 2^32 depends only on the low bytes of its
// factors. By induction, after n bytes,
//
//	H(h) = (h - low(h)) * p^n + H(low(h))
//
// where low(h) = h & 0xff: the high bits only ride along, multiplied by p^n.
// So 256 runs of the text, from the states 0..255, describe it completely.
// Those runs are independent, so they go eight at a time and cost about 40
// plain passes on this generation of CPUs, not 256; an entry is given a
// transfer only once it has been hashed often enough to repay that.
type fnvTransfer struct {
	mul uint32      // p^n mod 2^32
	out [256]uint32 // out[l] = H(l)
}

func newFNVTransfer(text []byte) *fnvTransfer {
	t := &fnvTransfer{mul: 1}
	for range text {
		t.mul *= fnvPrime32
	}
	for l := 0; l < 256; l += 8 {
		h0, h1, h2, h3 := uint32(l), uint32(l+1), uint32(l+2), uint32(l+3)
		h4, h5, h6, h7 := uint32(l+4), uint32(l+5), uint32(l+6), uint32(l+7)
		for _, c := range text {
			x := uint32(c)
			h0 = (h0 ^ x) * fnvPrime32
			h1 = (h1 ^ x) * fnvPrime32
			h2 = (h2 ^ x) * fnvPrime32
			h3 = (h3 ^ x) * fnvPrime32
			h4 = (h4 ^ x) * fnvPrime32
			h5 = (h5 ^ x) * fnvPrime32
			h6 = (h6 ^ x) * fnvPrime32
			h7 = (h7 ^ x) * fnvPrime32
		}
		t.out[l], t.out[l+1], t.out[l+2], t.out[l+3] = h0, h1, h2, h3
		t.out[l+4], t.out[l+5], t.out[l+6], t.out[l+7] = h4, h5, h6, h7
	}
	return t
}

// apply returns the state after the text, from state h.
func (t *fnvTransfer) apply(h uint32) uint32 {
	return (h&^0xff)*t.mul + t.out[h&0xff]
}

// then returns the transfer of this text followed by next's.
func (t *fnvTransfer) then(next *fnvTransfer) *fnvTransfer {
	out := &fnvTransfer{mul: t.mul * next.mul}
	for l, h := range t.out {
		out.out[l] = next.apply(h)
	}
	return out
}

// identityTransfer is the transfer of the empty text.
func identityTransfer() *fnvTransfer {
	t := &fnvTransfer{mul: 1}
	for l := range t.out {
		t.out[l] = uint32(l)
	}
	return t
}
