package criuimg

import "io"

// Receiver takes one file of memory as it is produced, in order, wherever it goes (a staged
// image, a store): a pages file CRIU sends gpucr's page server, or a range of memory gpucr
// saves itself.
type Receiver interface {
	// Receive reads the file's next size bytes from r. addr is where they start: the pages'
	// virtual address (or shared-memory offset) in a pages file, the offset in a file of
	// gpucr's own. A receiver that cuts chunks by address cuts where it crosses a boundary.
	Receive(addr uint64, size int, r io.Reader) error
	// Close ends the file; no more bytes follow.
	Close() error
}
