import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialDeletion;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.errors.AuthenticationException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java client over TLS and SASL against kbroker. Arguments: bootstrap, scenario, then key=value pairs;
 * `prop.<client config>=<value>` pairs go into every client's config (security.protocol, ssl.*, sasl.*).
 * Prints `OK ...` lines and `DONE <scenario>` at the end; `FAIL ...` and exit 1 on a failed check.
 */
public final class SecurityCompat {
    private final String bootstrap;
    private final Map<String, String> args;

    SecurityCompat(String bootstrap, Map<String, String> args) {
        this.bootstrap = bootstrap;
        this.args = args;
    }

    public static void main(String[] argv) {
        Map<String, String> a = new HashMap<>();
        for (int i = 2; i < argv.length; i++) {
            int eq = argv[i].indexOf('=');
            a.put(argv[i].substring(0, eq), argv[i].substring(eq + 1));
        }
        SecurityCompat s = new SecurityCompat(argv[0], a);
        try {
            for (String scenario : argv[1].split(",")) {
                switch (scenario) {
                    case "roundtrip": s.roundtrip(); break;
                    case "badauth": s.badauth(); break;
                    case "scram-admin": s.scramAdmin(); break;
                    case "steady": s.steady(); break;
                    default: throw new IllegalArgumentException("unknown scenario " + scenario);
                }
            }
        } catch (Throwable t) {
            System.out.println("FAIL " + argv[1] + ": " + t);
            System.out.flush();
            t.printStackTrace();
            System.exit(1);
        }
        System.out.println("DONE " + argv[1]);
        System.out.flush();
        System.exit(0);
    }

    static void ok(String fmt, Object... a) {
        System.out.println("OK " + String.format(fmt, a));
        System.out.flush();
    }

    static void check(boolean cond, String fmt, Object... a) {
        if (!cond) throw new IllegalStateException(String.format(fmt, a));
    }

    Properties common() {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", "kbroker-java-security");
        for (Map.Entry<String, String> e : args.entrySet()) {
            if (e.getKey().startsWith("prop.")) p.put(e.getKey().substring(5), e.getValue());
        }
        return p;
    }

    KafkaProducer<byte[], byte[]> producer() {
        Properties p = common();
        p.put("key.serializer", ByteArraySerializer.class.getName());
        p.put("value.serializer", ByteArraySerializer.class.getName());
        p.put("enable.idempotence", "false");
        p.put("acks", "all");
        p.put("max.block.ms", "15000");
        return new KafkaProducer<>(p);
    }

    KafkaConsumer<byte[], byte[]> consumer(String group) {
        Properties p = common();
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("group.id", group);
        p.put("auto.offset.reset", "earliest");
        p.put("enable.auto.commit", "false");
        return new KafkaConsumer<>(p);
    }

    /** Produce `count` records, then consume them with a group and commit. */
    void roundtrip() throws Exception {
        String topic = args.get("topic");
        int count = Integer.parseInt(args.getOrDefault("count", "1000"));
        try (KafkaProducer<byte[], byte[]> producer = producer()) {
            List<Future<RecordMetadata>> fs = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                fs.add(producer.send(new ProducerRecord<>(topic, ("k" + i).getBytes(), ("v" + i).getBytes())));
            }
            for (Future<RecordMetadata> f : fs) f.get();
        }
        ok("produced %d", count);
        int seen = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(args.getOrDefault("group", "java-sec-" + topic))) {
            consumer.subscribe(Collections.singletonList(topic));
            long deadline = System.currentTimeMillis() + 60000;
            while (seen < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    check(new String(r.value()).equals("v" + r.offset()), "record %d is %s", r.offset(), new String(r.value()));
                    seen++;
                }
            }
            consumer.commitSync();
        }
        check(seen == count, "consumed %d of %d", seen, count);
        ok("consumed %d", seen);
    }

    /** The client must fail authenticating: SaslAuthenticationException carrying the broker's message (bad
     *  credentials) or UnsupportedSaslMechanismException (a mechanism the listener does not offer). */
    void badauth() throws Exception {
        try (KafkaProducer<byte[], byte[]> producer = producer()) {
            producer.send(new ProducerRecord<>(args.getOrDefault("topic", "never"), "x".getBytes())).get();
            throw new IllegalStateException("the send succeeded");
        } catch (ExecutionException | org.apache.kafka.common.KafkaException e) {
            Throwable cause = e instanceof ExecutionException ? e.getCause() : e;
            while (cause != null && !(cause instanceof AuthenticationException) && cause.getCause() != null
                    && cause.getCause() != cause) cause = cause.getCause();
            check(cause instanceof AuthenticationException, "failed with %s", e);
            ok("authfail %s: %s", cause.getClass().getSimpleName(), cause.getMessage());
        }
    }

    /** AlterUserScramCredentials / DescribeUserScramCredentials through the Java Admin client. */
    void scramAdmin() throws Exception {
        String user = args.get("user");
        String password = args.get("password");
        try (Admin admin = Admin.create(common())) {
            admin.alterUserScramCredentials(List.of(
                    new UserScramCredentialUpsertion(user, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), password),
                    new UserScramCredentialUpsertion(user, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password)))
                    .all().get();
            ok("alterUserScramCredentials %s", user);
            Map<String, UserScramCredentialsDescription> d = admin.describeUserScramCredentials(List.of(user)).all().get();
            List<String> infos = new ArrayList<>();
            for (ScramCredentialInfo i : d.get(user).credentialInfos()) infos.add(i.mechanism() + ":" + i.iterations());
            Collections.sort(infos);
            check(infos.equals(List.of("SCRAM_SHA_256:4096", "SCRAM_SHA_512:8192")), "described %s", infos);
            ok("describeUserScramCredentials %s", infos);
            if (args.containsKey("delete")) {
                admin.alterUserScramCredentials(List.of(new UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)))
                        .all().get();
                ok("deleted %s SCRAM-SHA-512", user);
            }
        }
    }

    /** One record every 100 ms for `seconds`: with a short session lifetime the client re-authenticates. */
    void steady() throws Exception {
        String topic = args.get("topic");
        int n = 0;
        try (KafkaProducer<byte[], byte[]> producer = producer()) {
            producer.send(new ProducerRecord<>(topic, "first".getBytes())).get();  // connected and authenticated
            long end = System.currentTimeMillis() + 1000L * Integer.parseInt(args.getOrDefault("seconds", "5"));
            while (System.currentTimeMillis() < end) {
                producer.send(new ProducerRecord<>(topic, ("v" + n).getBytes())).get();
                n++;
                Thread.sleep(100);
            }
        }
        ok("steady %d", n);
    }
}
