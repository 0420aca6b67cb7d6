package criuimg

// PageSize is the unit of CRIU's runs of pages: gpucr checkpoints x86-64 and arm64 with
// 4 KiB pages.
const PageSize = 4096

// The flags of a pagemap entry (criu/include/pagemap.h).
const (
	PEParent  = 1 << 0 // the pages are in the parent image
	PELazy    = 1 << 1 // the pages may be restored lazily, from a page server
	PEPresent = 1 << 2 // the pages are in the pages file
)
