// Package warmfile is the format of the warm-start file (the "snapshot
// file" of --snapshot-dir): for each resource entry, the resourceVersion
// its data is as of, its indexes as tables (what lookups read, loaded
// first) and its projected objects (what later writes need); for the
// config they were built for.
//
// A file is untrusted input: Decode checks its checksum, its format
// version and every length, count and reference against what is there, and
// returns an error, never a panic, for anything it cannot read. What it
// accepts, Table.Each and Resource.EachObject read without a failure.
//
// Layout (integers are unsigned varints unless said otherwise; a string is
// its length, then its bytes):
//
//	magic      "metasync-snapshot\n"
//	version    Version
//	config     32 bytes: the hash of the resource entries it was built for
//	cluster    string: the identity of the cluster the data came from
//	           ("" when it could not be read)
//	written    unix nanoseconds, as a varint
//	resources  count, then each:
//	  name, resourceVersion, flags (1: relist, see Resource.Relist),
//	  indexes (count, then names),
//	  strings (count, then each): the values and object keys of the tables,
//	  for each index, its table: 1 if it lists object keys, else 0; then
//	    for each key (each once): the byte 1, the key, its values (count,
//	    then each string's number, in the order of the strings they name,
//	    each once), and, if it lists them, its object keys (likewise);
//	    then the byte 0,
//	  objects, each: the byte 1, then
//	    key,
//	    payload: 0 for none, else length+1, then the bytes,
//	    provenance: resourceVersion (string), creation time (seconds
//	      since 1970, 0 unknown),
//	    for each index: entries (count, then each: key, then the value:
//	      0 for the object key, else length+1, then the bytes),
//	  then the byte 0
//	checksum   4 bytes, little endian: CRC-32C of everything before it
//
// A file of several clusters' data (VersionClusters) differs in its header
// and in each resource's:
//
//	magic, version, config as above
//	clusters   count, then each: name, identity ("" when unknown)
//	written    as above
//	resources  count, then each:
//	  name, flags (2: its tables are left out, see Resource.TablesLeftOut),
//	  parts (count, then each: cluster (a name of the header's), its
//	    resourceVersion, flags (1: relist)),
//	  indexes, strings, tables (none when left out), objects as above,
//	    each object's key beginning with "CLUSTER:" of one of the parts
//	checksum   as above
package warmfile

import (
	"hash/crc32"
	"time"

	"github.com/iidp/metasync/indexer"
)

// Version is the format version of a file of one cluster's data
// (NewEncoder); VersionClusters that of a file of several clusters' data
// (NewClustersEncoder), each resource's objects in parts, one per
// cluster. Decode reads both.
const (
	Version         = 4
	VersionClusters = 5
)

const magic = "metasync-snapshot\n"

// The flags of a resource (of a part, in VersionClusters).
const (
	flagRelist     = 1
	flagNoTables   = 2 // VersionClusters: the resource's tables are left out
	resourceFlags5 = flagNoTables
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// File is a decoded file. Its strings are substrings of the data it
// was decoded from, which must not change while they are used: clone what
// is kept.
type File struct {
	// Version is Version or VersionClusters.
	Version int
	Config  [32]byte
	// Cluster names the cluster the data came from (the engine writes the
	// UID of its kube-system namespace); "" when it was not known, and in
	// a file of several clusters (see Clusters).
	Cluster string
	// Clusters, in a file of several clusters' data (VersionClusters):
	// each cluster of its resources' parts, with its identity; nil in a
	// file of one cluster.
	Clusters  []Cluster
	WrittenAt time.Time
	Resources []Resource
}

// Cluster is one cluster of a file of several clusters' data: its name
// in the config, and its identity as Cluster in a file of one ("" when
// it was not known).
type Cluster struct {
	Name, Identity string
}

// Part is one cluster's part of a resource, in a file of several
// clusters' data: the objects whose keys begin with "Cluster:", as of
// ResourceVersion, with Relist as Resource.Relist says it for a resource
// of one cluster.
type Part struct {
	Cluster         string
	ResourceVersion string
	Relist          bool
	// Objects is the number of the part's objects (set by Decode).
	Objects int
}

// Resource is one resource entry of a file.
type Resource struct {
	Name            string
	ResourceVersion string
	// Relist: the data is what the resource answered under an earlier
	// definition of its entry, which it had not listed since: it must be
	// listed, never resumed, from ResourceVersion.
	Relist  bool
	Indexes []string
	// Strings are the values and object keys that the tables name by
	// their number.
	Strings []string
	// Tables holds one table per index.
	Tables []Table
	// Objects is the number of objects (see EachObject).
	Objects int
	// MaxEntries and MaxBytes are, for each index, the most entries that
	// one object has in it and the most bytes of their keys and values.
	MaxEntries, MaxBytes []int
	// Parts, in a file of several clusters' data, are the resource's
	// parts (ResourceVersion and Relist are then unused); nil in a file
	// of one cluster. TablesLeftOut: the file has no tables for the
	// resource (Tables is empty): it is built from its objects.
	Parts         []Part
	TablesLeftOut bool
	objects       []byte // validated
}

// Table is one index of a file: each key with its values and, when
// WithObjects, the object keys behind it.
type Table struct {
	WithObjects bool
	Keys        int
	raw         []byte // validated
}

// Object is one projected object: its key, its payload (the projected
// fields) if it has one, and its entries for each index, in the order of
// Resource.Indexes (nil when it has none in any).
type Object struct {
	Key        string
	Payload    string
	HasPayload bool
	// Meta is the object's provenance: its resourceVersion and creation
	// time, for explain and unique indexes.
	Meta    indexer.Meta
	Entries [][]indexer.Entry
}
