import java.io.*;
import java.util.*;
import java.util.concurrent.atomic.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * An idempotent acks=all producer for tests/coordinator/test_replication_chaos.py: writes "<prefix>-<seq>"
 * round-robin over the topic's partitions, about one record per millisecond, until a line arrives on stdin;
 * then flushes and exits. One line per outcome:
 *   A value partition offset     (acknowledged)
 *   E value error                (failed)
 */
public class ChaosProducer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], prefix = args[3];
        int partitions = Integer.parseInt(args[2]);
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "600000");
        props.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, "10000");
        props.put(ProducerConfig.RETRY_BACKOFF_MS_CONFIG, "100");
        props.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "600000");
        AtomicBoolean done = new AtomicBoolean(false);
        Thread stdin = new Thread(() -> {
            try {
                new BufferedReader(new InputStreamReader(System.in)).readLine();
            } catch (IOException e) {
                // stdin closed: stop as well
            }
            done.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();
        PrintStream out = new PrintStream(new BufferedOutputStream(System.out, 1 << 16), false);
        try (Producer<byte[], byte[]> producer =
                     new KafkaProducer<>(props, new ByteArraySerializer(), new ByteArraySerializer())) {
            long seq = 0;
            while (!done.get()) {
                String value = prefix + "-" + seq;
                producer.send(new ProducerRecord<>(topic, (int) (seq % partitions), null, value.getBytes()),
                        (md, e) -> {
                            synchronized (out) {
                                if (e == null) {
                                    out.println("A " + value + " " + md.partition() + " " + md.offset());
                                } else {
                                    out.println("E " + value + " " + e);
                                }
                            }
                        });
                seq++;
                Thread.sleep(1);
            }
            producer.flush();
        }
        synchronized (out) {
            out.flush();
        }
    }
}
