module github.com/bmdb-dev/bmdb

go 1.26.8

require (
	github.com/golang-migrate/migrate/v4 v4.20.1
	github.com/google/uuid v1.6.0
	github.com/lib/pq v1.12.3
	k8s.io/klog/v2 v2.140.0
)

require (
	github.com/cockroachdb/cockroach-go/v2 v2.4.2 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	go.uber.org/goleak v1.3.0 // indirect
)
