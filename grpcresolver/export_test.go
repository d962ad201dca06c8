package grpcresolver

// Followers is followers, for the package's external tests.
var Followers = followers

// HomeOf and HasIndex are homeOf and hasIndex, for the package's external
// tests.
var (
	HomeOf   = homeOf
	HasIndex = hasIndex
)
