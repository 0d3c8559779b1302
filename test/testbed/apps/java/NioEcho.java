// NioEcho: a TCP echo server on java.nio, the way Java servers (Netty, Jetty, Tomcat's
// NIO connector) read and write: one Selector thread, non-blocking channels, a direct
// buffer per connection. Echoes every byte in order; once a client half-closes and all
// was echoed, it half-closes too and closes.
//
// Usage: java -cp DIR NioEcho HOST PORT READY_FILE (the file is created once listening).

import java.io.IOException;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;

public final class NioEcho {
    /** One connection's state: bytes read and not yet echoed, and whether it ended. */
    private static final class Conn {
        final ByteBuffer buf = ByteBuffer.allocateDirect(64 << 10);
        boolean eof;
    }

    public static void main(String[] args) throws IOException {
        if (args.length != 3) {
            System.err.println("usage: NioEcho HOST PORT READY_FILE");
            System.exit(2);
        }
        Selector selector = Selector.open();
        ServerSocketChannel server = ServerSocketChannel.open();
        server.bind(new InetSocketAddress(args[0], Integer.parseInt(args[1])));
        server.configureBlocking(false);
        server.register(selector, SelectionKey.OP_ACCEPT);
        Files.write(Path.of(args[2]), new byte[0]);
        while (true) {
            selector.select();
            for (SelectionKey key : selector.selectedKeys()) {
                try {
                    if (key.isAcceptable()) {
                        accept(server, selector);
                    } else {
                        serve(key);
                    }
                } catch (IOException e) {
                    System.err.println("NioEcho: " + key.channel() + ": " + e);
                    key.cancel();
                    key.channel().close();
                }
            }
            selector.selectedKeys().clear();
        }
    }

    private static void accept(ServerSocketChannel server, Selector selector) throws IOException {
        SocketChannel ch = server.accept();
        if (ch != null) {
            ch.configureBlocking(false);
            ch.register(selector, SelectionKey.OP_READ, new Conn());
        }
    }

    /** Reads what there is, writes what it can; waits for writability while bytes wait. */
    private static void serve(SelectionKey key) throws IOException {
        SocketChannel ch = (SocketChannel) key.channel();
        Conn c = (Conn) key.attachment();
        if (key.isReadable() && !c.eof && c.buf.hasRemaining()) {
            if (ch.read(c.buf) < 0) {
                c.eof = true;
            }
        }
        c.buf.flip();
        ch.write(c.buf);
        c.buf.compact();
        boolean pending = c.buf.position() > 0;
        if (c.eof && !pending) {
            ch.shutdownOutput();
            key.cancel();
            ch.close();
            return;
        }
        int ops = pending ? SelectionKey.OP_WRITE : 0;
        if (!c.eof && c.buf.hasRemaining()) {
            ops |= SelectionKey.OP_READ;
        }
        key.interestOps(ops);
    }
}
