// swift-tools-version: 6.2
import Foundation
import PackageDescription

let strict: [SwiftSetting] = [.enableUpcomingFeature("ExistentialAny")]
/// Nonisolated async functions run on their caller's executor (SE-0461) instead of hopping to the generic one and
/// back: on the front door's request path (its event loop), each hop cost a `swift_task_switch` with the task's status
/// lock. Only in the modules on that path; their blocking work runs on their own threads either way.
let nonsending: [SwiftSetting] = [.enableUpcomingFeature("NonisolatedNonsendingByDefault")]

let package = Package(
    name: "entitlement-fleet",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "fleet", targets: ["fleet"]),
        .library(name: "AppStoreVerification", targets: ["AppStoreVerification"]),
        .library(name: "EntitlementDomain", targets: ["EntitlementDomain"]),
        .library(name: "FleetKafka", targets: ["FleetKafka"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-configuration.git", from: "1.4.0", traits: [.defaults, "YAML"]),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        // Already in the graph through postgres-nio; named so FleetSink can import NIOCore/NIOSSL directly.
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        // Already in the graph through Hummingbird; named so FleetTestSupport can import HTTPTypes directly.
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        // Already in the graph through Hummingbird; named for NIOHTTPTypes (the ingest's channel handlers).
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
    ],
    targets: [
        // All librdkafka C calls go through this system library, used only by FleetKafka.
        .systemLibrary(name: "CRdKafka", pkgConfig: "rdkafka", providers: [.apt(["librdkafka-dev"])]),
        .target(
            name: "FleetKafka",
            dependencies: [
                "CRdKafka",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: strict + nonsending
        ),
        // Pure verification core: no I/O.
        .target(
            name: "AppStoreVerification",
            dependencies: [
                .product(name: "Crypto", package: "swift-crypto"),
                // RSA-1024 keys of StoreKit 1 transaction receipt signers (swift-certificates needs 2048 bits).
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: strict
        ),
        // `--revocation-check`: OCSP over AsyncHTTPClient for the core's revocation checker, and its metrics.
        .target(
            name: "FleetRevocation",
            dependencies: [
                "AppStoreVerification",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: strict
        ),
        // Loopback ports for the processes the fleet starts itself (demo, benchmarks, tests' responders): plain sockets,
        // no dependencies, so that both the dev stack and the test PKI choose ports the same way.
        .target(name: "FleetLoopback", swiftSettings: strict),
        // An Apple-shaped test PKI and JWS signer (tests, benchmarks, demo traffic). Never trusted in production.
        .target(
            name: "FleetTestPKI",
            dependencies: [
                "AppStoreVerification", "FleetLoopback",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: strict
        ),
        // Entitlement domain: mapping, event schema, product catalogue. No Kafka, no PostgreSQL.
        .target(
            name: "EntitlementDomain",
            dependencies: [
                "AppStoreVerification",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Yams", package: "Yams"),
            ],
            swiftSettings: strict
        ),
        // Entitlement rules: the sink's state machine (applied/stale/duplicate, windows, supersede, restore, ledger),
        // plain Swift over the current rows. No Kafka, no PostgreSQL.
        .target(
            name: "EntitlementRules",
            dependencies: ["EntitlementDomain"],
            swiftSettings: strict
        ),
        // Layered settings (file < env < flags): swift-configuration and Yams only, no HTTP (fuzzed on its own).
        .target(
            name: "FleetConfig",
            dependencies: [
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "Yams", package: "Yams"),
            ],
            swiftSettings: strict
        ),
        // Shared service plumbing: configuration (FleetConfig, re-exported), metrics/health HTTP, logging, signals.
        .target(
            name: "FleetOperations",
            dependencies: [
                "FleetConfig",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "FleetWorker",
            dependencies: [
                "AppStoreVerification", "EntitlementDomain", "FleetKafka", "FleetOperations",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        .target(
            name: "FleetSink",
            dependencies: [
                "EntitlementDomain", "EntitlementRules", "AppStoreVerification", "FleetKafka", "FleetOperations",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // `fleet dashboard`: live aggregates of the result and rejected topics, served over HTTP.
        .target(
            name: "FleetDashboard",
            dependencies: [
                "AppStoreVerification", "EntitlementDomain", "EntitlementRules", "FleetKafka", "FleetOperations",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // `fleet ingest`: the HTTP front door (Apple's notifications, apps' transactions) publishing to the raw topic.
        // The front door's request-body classification, pure (no Hummingbird): fuzzed on its own.
        .target(name: "FleetIngestRequests", dependencies: ["AppStoreVerification"], swiftSettings: strict),
        .target(
            name: "FleetIngest",
            dependencies: [
                "FleetIngestRequests", "AppStoreVerification", "EntitlementDomain", "FleetKafka", "FleetOperations", "FleetWorker",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict + nonsending
        ),
        // A small blocking HTTP/1.1 keep-alive client for `fleet ingest` (demo traffic, `fleet bench ingest`, tests).
        .target(name: "FleetIngestClient", swiftSettings: strict),
        // Development stack, never in a production module: the embedded (mock) Kafka cluster and its retention watch,
        // the throwaway PostgreSQL, a strict local stand-in for Apple's App Store Server API, the loopback HTTP probe,
        // the running binary's path. Used by the demo, the chaos soak, the benchmarks, `fleet dev-kafka` and the tests.
        .target(
            name: "FleetDevStack",
            dependencies: [
                "FleetKafka", "AppStoreServerAPI", "AppStoreVerification", "FleetLoopback",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // `fleet demo` / `fleet bench chaos`: the whole stack on embedded defaults, its traffic generator, the chaos soak.
        .target(
            name: "FleetDemo",
            dependencies: [
                "AppStoreVerification", "FleetTestPKI", "EntitlementDomain", "FleetKafka", "FleetOperations", "FleetSink",
                "FleetIngestClient", "FleetDevStack",
                "FleetWorker", "FleetResponder",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // `fleet bench verify|kafka|worker|sink|pipeline|ingest`: each prints the project's figure beside a reference
        // measured in the same run. The CLI only parses their flags.
        .target(
            name: "FleetBenchmarks",
            dependencies: [
                "AppStoreVerification", "FleetTestPKI", "EntitlementDomain", "FleetKafka", "FleetOperations", "FleetSink",
                "FleetWorker", "FleetIngest", "FleetIngestClient", "FleetDemo", "FleetDevStack", "FleetRevocation",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // App Store Server API client (ES256 JWT, typed endpoints, retry rules). No Kafka, no PostgreSQL.
        .target(
            name: "AppStoreServerAPI",
            dependencies: [
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // `fleet responder`: answers CONSUMPTION_REQUESTs with Consumption Information v2, recorded in PostgreSQL.
        .target(
            name: "FleetResponder",
            dependencies: [
                "AppStoreServerAPI", "EntitlementDomain", "FleetKafka", "FleetOperations", "FleetSink",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strict
        ),
        // Shared by the test targets: the `fleet` binary (FLEET_EXECUTABLE) and child processes, topic readers and Kafka
        // helpers, the per-process throwaway PostgreSQL, event generators. Tests only.
        .target(
            name: "FleetTestSupport",
            dependencies: [
                "AppStoreServerAPI", "AppStoreVerification", "FleetTestPKI", "EntitlementDomain", "FleetKafka", "FleetDevStack",
                "FleetSink",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        // Fuzz targets' invariants and seed corpora (issue 21): run by the libFuzzer binary and by the tests.
        .target(
            name: "FleetFuzzing",
            dependencies: [
                "AppStoreVerification", "EntitlementDomain", "FleetConfig", "FleetIngestRequests", "FleetTestPKI",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "fleet",
            dependencies: [
                "AppStoreVerification", "EntitlementDomain", "FleetKafka",
                "FleetOperations", "FleetWorker", "FleetSink", "FleetDemo", "FleetDevStack", "FleetBenchmarks",
                "FleetDashboard",
                "AppStoreServerAPI", "FleetResponder",
                "FleetIngest", "FleetRevocation",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .testTarget(
            name: "AppStoreVerificationTests",
            dependencies: [
                "AppStoreVerification", "FleetTestPKI",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ]
        ),
        .testTarget(name: "FleetRevocationTests", dependencies: [
            "FleetRevocation", "AppStoreVerification", "FleetTestPKI", "FleetTestSupport",
        ]),
        .testTarget(name: "EntitlementDomainTests", dependencies: [
            "EntitlementDomain", "AppStoreVerification", .product(name: "Crypto", package: "swift-crypto"),
        ]),
        .testTarget(name: "FleetKafkaTests", dependencies: ["FleetKafka", "FleetOperations", "FleetDevStack", "FleetTestSupport"]),
        .testTarget(name: "FleetWorkerTests", dependencies: [
            "FleetWorker", "FleetKafka", "FleetTestPKI", "EntitlementDomain", "FleetDevStack", "AppStoreVerification", "FleetOperations",
            "FleetTestSupport", "FleetRevocation",
            .product(name: "Crypto", package: "swift-crypto"), .product(name: "Logging", package: "swift-log"),
        ]),
        .testTarget(name: "FleetBenchmarksTests", dependencies: ["FleetBenchmarks", "AppStoreVerification"]),
        .testTarget(name: "FleetDemoTests", dependencies: [
            "FleetDemo", "AppStoreVerification", "EntitlementDomain", "FleetDevStack", "FleetKafka", "FleetTestPKI", "FleetWorker",
            "FleetLoopback",
        ]),
        .testTarget(
            name: "FleetSinkTests",
            dependencies: [
                "FleetSink", "FleetKafka", "EntitlementDomain", "EntitlementRules", "AppStoreVerification", "FleetTestPKI",
                "FleetDevStack", "FleetTestSupport",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]),
        .testTarget(name: "FleetIngestTests", dependencies: [
            "FleetIngest", "FleetIngestRequests", "FleetIngestClient", "FleetKafka", "FleetWorker", "FleetTestPKI",
            "FleetOperations", "FleetDevStack", "FleetTestSupport",
            "AppStoreVerification", "EntitlementDomain", .product(name: "Logging", package: "swift-log"),
            .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            .product(name: "Hummingbird", package: "hummingbird"), .product(name: "HummingbirdCore", package: "hummingbird"),
            .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOEmbedded", package: "swift-nio"), .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
            .product(name: "HTTPTypes", package: "swift-http-types"),
        ]),
        .testTarget(name: "FleetDashboardTests", dependencies: [
            "FleetDashboard", "FleetKafka", "FleetOperations", "EntitlementDomain", "AppStoreVerification", "FleetDevStack",
            .product(name: "Logging", package: "swift-log"), .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
        ]),
        .testTarget(name: "FleetOperationsTests", dependencies: ["FleetOperations", "FleetDevStack", .product(name: "Logging", package: "swift-log")]),
        .testTarget(name: "FleetCLITests", dependencies: [
            "fleet", "FleetTestPKI", "FleetOperations", "AppStoreVerification", "FleetKafka", "EntitlementDomain",
            "FleetTestSupport", "AppStoreServerAPI", "FleetSink", "FleetIngestClient", "FleetDevStack",
            .product(name: "Crypto", package: "swift-crypto"),
        ]),
        .testTarget(name: "FleetResponderTests", dependencies: [
            "FleetResponder", "FleetSink", "FleetKafka", "FleetTestSupport", "FleetTestPKI", "AppStoreServerAPI", "EntitlementDomain",
            "FleetDevStack",
            .product(name: "PostgresNIO", package: "postgres-nio"),
            .product(name: "Logging", package: "swift-log"),
            .product(name: "Crypto", package: "swift-crypto"),
        ]),
        .testTarget(name: "FleetFuzzingTests", dependencies: [
            "FleetFuzzing", "FleetTestPKI", "AppStoreVerification", "EntitlementDomain", "FleetIngestRequests",
            "FleetTestSupport",
        ]),
        .testTarget(name: "AppStoreServerAPITests", dependencies: [
            "AppStoreServerAPI", "FleetTestSupport", "FleetTestPKI", "AppStoreVerification", "FleetDevStack",
            .product(name: "Crypto", package: "swift-crypto"),
        ]),
    ],
    swiftLanguageModes: [.v6]
)

// The libFuzzer binary exists only in the fuzz build (`make fuzz`: FLEET_FUZZ_BUILD=1, `--sanitize fuzzer
// --sanitize address`, scratch path .build-fuzz): it has no `main` of its own (libFuzzer's), so a normal
// `swift build` must not see it.
if ProcessInfo.processInfo.environment["FLEET_FUZZ_BUILD"] == "1" {
    package.targets.append(
        .executableTarget(
            name: "fleet-fuzz", dependencies: ["FleetFuzzing"], path: "Fuzz/fleet-fuzz",
            swiftSettings: [.unsafeFlags(["-parse-as-library"])]))
}
