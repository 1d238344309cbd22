import java.time.Duration;
import java.util.Arrays;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.TimeWindows;

/**
 * One instance of the tests' Kafka Streams application (exactly_once_v2): a word count (repartition by word, a
 * state store and its changelog), clicks counted per user in 10 s windows, and orders joined with a users table.
 * Arguments: bootstrap, state dir, standby replicas, replication factor, and optionally the group protocol
 * ("classic", the default, or "streams": KIP-1071, Kafka Streams 4.2+). Prints "STATE <new state>" lines; stops
 * cleanly on SIGTERM.
 */
public final class StreamsApp {
    public static void main(String[] a) throws Exception {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, "kbroker-streams-test");
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, a[0]);
        p.put(StreamsConfig.STATE_DIR_CONFIG, a[1]);
        p.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, Integer.parseInt(a[2]));
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, Integer.parseInt(a[3]));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        String protocol = a.length > 4 ? a[4] : "classic";
        if (protocol.equals("streams")) {
            // The session timeout is the broker's (group.streams.session.timeout.ms) with this protocol.
            p.put("group.protocol", "streams");
        } else {
            // A killed instance's partitions move within seconds, and its open transaction is aborted soon after.
            p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 6000);
            p.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 1000);
        }
        p.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 10000);

        StreamsBuilder b = new StreamsBuilder();
        b.<String, String>stream("words-in")
            .flatMapValues(v -> Arrays.asList(v.toLowerCase().split("\\W+")))
            .filter((k, w) -> !w.isEmpty())
            .groupBy((k, w) -> w)
            .count(Materialized.as("word-counts-store"))
            .toStream()
            .mapValues(Object::toString)
            .to("word-counts");
        b.<String, String>stream("clicks")
            .groupByKey()
            .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofSeconds(10), Duration.ofDays(1)))
            .count(Materialized.as("clicks-store"))
            .toStream((wk, n) -> wk.key() + "@" + wk.window().start())
            .mapValues(Object::toString)
            .to("clicks-per-window");
        KTable<String, String> users = b.table("users");
        b.<String, String>stream("orders")
            .join(users, (amount, name) -> name + ":" + amount)
            .to("orders-enriched");

        KafkaStreams streams = new KafkaStreams(b.build(), p);
        CountDownLatch stopped = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("STATE " + now);
            System.out.flush();
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.out.println("ERROR " + e);
            System.out.flush();
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                .REPLACE_THREAD;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(20));
            stopped.countDown();
        }));
        streams.start();
        stopped.await();
    }
}
