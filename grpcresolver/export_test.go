package grpcresolver

// Followers is followers, for the package's external tests.
var Followers = followers
